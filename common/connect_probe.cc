#include "common/connect_probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/tcp_probe.h"

namespace taskgrid {
namespace {

// The names (CN, then DNS and IP alternative names) of the peer's first
// certificate.
std::vector<std::string> PeerNames(gnutls_session_t session) {
  std::vector<std::string> names;
  unsigned int count = 0;
  const gnutls_datum_t* certs = gnutls_certificate_get_peers(session, &count);
  if (certs == nullptr || count == 0) return names;
  gnutls_x509_crt_t crt;
  if (gnutls_x509_crt_init(&crt) < 0) return names;
  if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) >= 0) {
    auto add = [&names](std::string n) {
      if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) {
        names.push_back(std::move(n));
      }
    };
    char buf[256];
    size_t size = sizeof(buf);
    if (gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, buf, &size) >= 0) {
      add(std::string(buf, size));
    }
    for (unsigned int i = 0;; ++i) {
      size = sizeof(buf);
      const int type = gnutls_x509_crt_get_subject_alt_name(crt, i, buf, &size, nullptr);
      if (type < 0) break;
      if (type == GNUTLS_SAN_DNSNAME) {
        add(std::string(buf, size));
      } else if (type == GNUTLS_SAN_IPADDRESS && (size == 4 || size == 16)) {
        char text[64];
        if (inet_ntop(size == 4 ? AF_INET : AF_INET6, buf, text, sizeof(text)) != nullptr) {
          add(text);
        }
      }
    }
    // The name check below needs the certificate too: keep it simple and
    // decode it twice rather than hand it out.
  }
  gnutls_x509_crt_deinit(crt);
  return names;
}

// Whether the peer's first certificate names `host` (a DNS name or an IP).
bool PeerNamesHost(gnutls_session_t session, const std::string& host) {
  unsigned int count = 0;
  const gnutls_datum_t* certs = gnutls_certificate_get_peers(session, &count);
  if (certs == nullptr || count == 0) return false;
  gnutls_x509_crt_t crt;
  if (gnutls_x509_crt_init(&crt) < 0) return false;
  bool ok = false;
  if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) >= 0) {
    ok = gnutls_x509_crt_check_hostname(crt, host.c_str()) != 0;
  }
  gnutls_x509_crt_deinit(crt);
  return ok;
}

std::string AlertText(gnutls_session_t session) {
  const char* name = gnutls_alert_get_name(gnutls_alert_get(session));
  return name == nullptr ? std::string("unknown alert") : std::string(name);
}

// Owns what a TLS probe allocates.
struct TlsSession {
  gnutls_certificate_credentials_t creds = nullptr;
  gnutls_session_t session = nullptr;
  int fd = -1;
  ~TlsSession() {
    if (session != nullptr) gnutls_deinit(session);
    if (creds != nullptr) gnutls_certificate_free_credentials(creds);
    if (fd >= 0) close(fd);
  }
};

std::string ProbeTls(const std::string& target, const std::string& host, int fd,
                     const ProbeFiles& files, absl::Duration within) {
  TlsSession t;
  t.fd = fd;
  const std::string failed = absl::StrCat("TLS handshake with ", target, " failed: ");
  if (gnutls_certificate_allocate_credentials(&t.creds) < 0) return "";
  const bool tls = !files.ca.empty();
  if (tls &&
      gnutls_certificate_set_x509_trust_file(t.creds, files.ca.c_str(), GNUTLS_X509_FMT_PEM) < 0) {
    return "";  // reading the files is the channel's business, and said so
  }
  if (tls && !files.cert.empty() &&
      gnutls_certificate_set_x509_key_file(t.creds, files.cert.c_str(), files.key.c_str(),
                                           GNUTLS_X509_FMT_PEM) < 0) {
    return "";
  }
  if (gnutls_init(&t.session, GNUTLS_CLIENT) < 0) return "";
  gnutls_set_default_priority(t.session);
  gnutls_credentials_set(t.session, GNUTLS_CRD_CERTIFICATE, t.creds);
  // gRPC servers expect HTTP/2 by ALPN.
  gnutls_datum_t h2 = {reinterpret_cast<unsigned char*>(const_cast<char*>("h2")), 2};
  gnutls_alpn_set_protocols(t.session, &h2, 1, 0);
  in6_addr ip;
  if (inet_pton(AF_INET, host.c_str(), &ip) != 1 && inet_pton(AF_INET6, host.c_str(), &ip) != 1) {
    gnutls_server_name_set(t.session, GNUTLS_NAME_DNS, host.data(), host.size());
  }
  gnutls_transport_set_int(t.session, fd);
  gnutls_handshake_set_timeout(t.session,
                               static_cast<unsigned int>(absl::ToInt64Milliseconds(within)));
  int ret;
  do {
    ret = gnutls_handshake(t.session);
  } while (ret < 0 && gnutls_error_is_fatal(ret) == 0);

  if (!tls) {
    // A plaintext client: does the scheduler speak TLS?
    if (ret >= 0 || ret == GNUTLS_E_FATAL_ALERT_RECEIVED) {
      return absl::StrCat("the scheduler at ", target,
                          " serves TLS, and this client connected without it: give --tls_ca "
                          "(and --tls_cert/--tls_key, or --token_file, as the scheduler requires)");
    }
    return "";
  }
  if (ret < 0) {
    if (ret == GNUTLS_E_FATAL_ALERT_RECEIVED) {
      const gnutls_alert_description_t alert = gnutls_alert_get(t.session);
      if (alert == GNUTLS_A_CERTIFICATE_REQUIRED || alert == GNUTLS_A_HANDSHAKE_FAILURE) {
        if (files.cert.empty()) {
          return failed + "the scheduler requires a client certificate (--tls_cert/--tls_key)";
        }
      }
      return absl::StrCat(failed, "the scheduler ended it (TLS alert: ", AlertText(t.session), ")");
    }
    if (ret == GNUTLS_E_UNEXPECTED_PACKET_LENGTH || ret == GNUTLS_E_UNEXPECTED_PACKET ||
        ret == GNUTLS_E_PREMATURE_TERMINATION || ret == GNUTLS_E_PULL_ERROR) {
      return absl::StrCat(failed, gnutls_strerror(ret),
                          " (does the scheduler serve TLS? it needs --tls_cert and --tls_key)");
    }
    return absl::StrCat(failed, gnutls_strerror(ret));
  }
  // The handshake went through without checks; now each check on its own,
  // to say which failed.
  unsigned int status = 0;
  if (gnutls_certificate_verify_peers2(t.session, &status) < 0 || status != 0) {
    gnutls_datum_t text = {nullptr, 0};
    std::string why = "not verified";
    if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text, 0) >= 0) {
      why.assign(reinterpret_cast<const char*>(text.data), text.size);
      gnutls_free(text.data);
    }
    if (status & (GNUTLS_CERT_EXPIRED | GNUTLS_CERT_NOT_ACTIVATED)) {
      return absl::StrCat(failed, "the scheduler's certificate is outside its validity period (",
                          why, ")");
    }
    return absl::StrCat(failed, "the scheduler's certificate is not signed by --tls_ca ", files.ca,
                        " (", why, ")");
  }
  if (!PeerNamesHost(t.session, host)) {
    const std::vector<std::string> names = PeerNames(t.session);
    return absl::StrCat(failed, "the scheduler's certificate does not name ", host,
                        "; names it has: ", names.empty() ? "none" : absl::StrJoin(names, ", "),
                        " (connect to one of them, or give it a certificate naming ", host, ")");
  }
  if (files.cert.empty() && gnutls_certificate_client_get_request_status(t.session) != 0) {
    return failed + "the scheduler requires a client certificate (--tls_cert/--tls_key)";
  }
  if (!files.cert.empty()) {
    // With TLS 1.3 a server refuses a client certificate after the
    // handshake, with an alert: wait a moment for one.
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(within), 1000))) >
        0) {
      char buf[256];
      const ssize_t n = gnutls_record_recv(t.session, buf, sizeof(buf));
      if (n == GNUTLS_E_FATAL_ALERT_RECEIVED) {
        return absl::StrCat(failed, "the scheduler refused the client certificate --tls_cert ",
                            files.cert, " (TLS alert: ", AlertText(t.session),
                            "; is it signed by the CA the scheduler's --tls_ca names?)");
      }
    }
  }
  return "";
}

}  // namespace

std::string ExplainConnectFailure(absl::string_view target, const ProbeFiles& files,
                                  absl::Duration within) {
  std::string host, port;
  if (!SplitTarget(target, &host, &port)) return "";
  int fd = -1;
  switch (ConnectTcp(target, within, &fd)) {
    case TcpProbe::kRefused:
      return absl::StrCat("nothing listens at ", target,
                          " (connection refused): is taskgrid-scheduler running there?");
    case TcpProbe::kNoAnswer:
      return absl::StrCat("no answer from ", target, " within ", absl::FormatDuration(within),
                          ": is taskgrid-scheduler running there, and the host up and reachable?");
    case TcpProbe::kAccepted:
      break;
  }
  return ProbeTls(std::string(target), host, fd, files, within);
}

}  // namespace taskgrid
