#include "common/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace taskgrid {

namespace {

// Larger than any certificate chain or token anyone means to give us.
constexpr std::streamsize kMaxFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": cannot read it: ", std::strerror(errno)));
  }
  std::string data(static_cast<size_t>(kMaxFileBytes) + 1, '\0');
  in.read(data.data(), kMaxFileBytes + 1);
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot read it"));
  }
  data.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<std::streamsize>(data.size()) > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": larger than ", kMaxFileBytes, " bytes"));
  }
  return data;
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path,
                                        const std::string& kind) {
  const std::string what = absl::StrCat(flag, " (", kind, ")");
  absl::StatusOr<std::string> pem = ReadSmallFile(what, path);
  if (!pem.ok()) return pem.status();
  const bool is_key = absl::StrContains(kind, "key");
  const bool looks_right = is_key ? absl::StrContains(*pem, "PRIVATE KEY-----")
                                  : absl::StrContains(*pem, "-----BEGIN CERTIFICATE-----");
  if (!looks_right) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": not a PEM ", kind, " (no '-----BEGIN ",
                     is_key ? "... PRIVATE KEY" : "CERTIFICATE", "-----' line)"));
  }
  return pem;
}

namespace {

// gRPC's file watcher reads the files again every `every` (at least a
// second): a renewed certificate, key or CA is used from the next handshake
// on, while a pair caught half-written (a key that does not match its
// certificate) is skipped until both are in place.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> Watcher(const TlsFiles& files) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(files.reload_every));
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, static_cast<unsigned int>(seconds));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  // Read once here for errors that name the flag; the watcher reads them
  // again from then on.
  absl::StatusOr<std::string> cert = ReadPemFile("--tls_cert", files.cert, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile("--tls_key", files.key, "private key");
  if (!key.ok()) return key.status();
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile("--tls_ca", files.ca, "CA certificate");
    if (!ca.ok()) return ca.status();
  }
  grpc::experimental::TlsServerCredentialsOptions opts(Watcher(files));
  opts.watch_identity_key_cert_pairs();
  if (!files.ca.empty()) {
    opts.watch_root_certs();
    opts.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    opts.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, const std::string& token) {
  if (files.ca.empty()) {
    if (!files.cert.empty() || !files.key.empty() || !token.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert, --tls_key and a token need --tls_ca (the CA that signed the scheduler's "
          "certificate): they are only sent over TLS");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (mTLS needs both)");
  }
  absl::StatusOr<std::string> ca = ReadPemFile("--tls_ca", files.ca, "CA certificate");
  if (!ca.ok()) return ca.status();
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile("--tls_cert", files.cert, "certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile("--tls_key", files.key, "private key");
    if (!key.ok()) return key.status();
  }
  grpc::experimental::TlsChannelCredentialsOptions opts;
  opts.set_certificate_provider(Watcher(files));
  opts.watch_root_certs();
  if (!files.cert.empty()) opts.watch_identity_key_cert_pairs();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(opts);
  if (creds == nullptr) return absl::InternalError("gRPC refused the TLS options");
  if (token.empty()) return creds;
  return grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  absl::StatusOr<std::string> data = ReadSmallFile("token file", path);
  if (!data.ok()) return data.status();
  std::string token(absl::StripAsciiWhitespace(*data));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": empty"));
  }
  for (char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        !absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, ": the token must be one word of printable characters"));
    }
  }
  return token;
}

std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& ctx) {
  std::vector<std::string> names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& v : ctx.FindPropertyValues(property)) {
      std::string name(v.data(), v.size());
      bool seen = false;
      for (const std::string& n : names) seen = seen || n == name;
      if (!seen) names.push_back(std::move(name));
    }
  }
  return names;
}

}  // namespace taskgrid
