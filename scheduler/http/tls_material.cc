#include "scheduler/http/tls_material.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace taskgrid::http {

namespace {

// Longer chains than this are not what anyone means to serve.
constexpr unsigned int kMaxChain = 16;

// The whole file, or nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return out.str();
}

gnutls_datum_t Datum(const std::string& s) {
  return gnutls_datum_t{reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
                        static_cast<unsigned int>(s.size())};
}

// Whether GnuTLS takes the certificate and key as a pair (the key is the
// certificate's): "" when it does, else what is wrong.
std::string CheckPair(const std::string& cert, const std::string& key) {
  gnutls_certificate_credentials_t creds = nullptr;
  if (gnutls_certificate_allocate_credentials(&creds) != GNUTLS_E_SUCCESS) return "out of memory";
  const gnutls_datum_t c = Datum(cert);
  const gnutls_datum_t k = Datum(key);
  const int rc = gnutls_certificate_set_x509_key_mem(creds, &c, &k, GNUTLS_X509_FMT_PEM);
  gnutls_certificate_free_credentials(creds);
  return rc < 0 ? absl::StrCat("the certificate and key: ", gnutls_strerror(rc)) : "";
}

}  // namespace

struct TlsMaterial::Generation {
  gnutls_pcert_st chain[kMaxChain];
  unsigned int length = 0;
  gnutls_privkey_t key = nullptr;
  gnutls_x509_trust_list_t trust = nullptr;  // null without a client CA
  std::string ca_pem;

  ~Generation() {
    for (unsigned int i = 0; i < length; ++i) gnutls_pcert_deinit(&chain[i]);
    if (key != nullptr) gnutls_privkey_deinit(key);
    if (trust != nullptr) gnutls_x509_trust_list_deinit(trust, 1);
  }
};

bool TlsMaterial::Stamp::operator==(const Stamp& o) const {
  return inode == o.inode && size == o.size && modified.tv_sec == o.modified.tv_sec &&
         modified.tv_nsec == o.modified.tv_nsec;
}

absl::StatusOr<std::unique_ptr<TlsMaterial>> TlsMaterial::Load(const std::string& cert,
                                                               const std::string& key,
                                                               const std::string& client_ca) {
  std::unique_ptr<TlsMaterial> m(new TlsMaterial(cert, key, client_ca));
  m->stamps_ = m->Stamps();
  absl::StatusOr<std::unique_ptr<Generation>> first = m->Read();
  if (!first.ok()) return first.status();
  m->first_client_ca_ = (*first)->ca_pem;
  m->generations_.push_back(*std::move(first));
  return m;
}

TlsMaterial::TlsMaterial(std::string cert, std::string key, std::string client_ca)
    : cert_path_(std::move(cert)), key_path_(std::move(key)), ca_path_(std::move(client_ca)) {}

TlsMaterial::~TlsMaterial() = default;

std::vector<TlsMaterial::Stamp> TlsMaterial::Stamps() const {
  std::vector<Stamp> out;
  for (const std::string* path : {&cert_path_, &key_path_, &ca_path_}) {
    Stamp s;
    struct stat st;
    if (!path->empty() && stat(path->c_str(), &st) == 0) {
      s.inode = st.st_ino;
      s.size = st.st_size;
      s.modified = st.st_mtim;
    }
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TlsMaterial::Generation>> TlsMaterial::Read() const {
  const auto fail = [&](const std::string& problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve HTTPS with certificate ", cert_path_, " and key ", key_path_,
                     ca_path_.empty() ? "" : " and client CA " + ca_path_, ": ", problem));
  };
  std::string pem[3];
  const std::string* paths[3] = {&cert_path_, &key_path_, &ca_path_};
  for (int i = 0; i < 3; ++i) {
    if (paths[i]->empty()) continue;
    std::optional<std::string> text = ReadFile(*paths[i]);
    if (!text.has_value()) return fail(absl::StrCat(*paths[i], " cannot be read"));
    pem[i] = *std::move(text);
  }
  if (std::string problem = CheckPair(pem[0], pem[1]); !problem.empty()) return fail(problem);

  auto g = std::make_unique<Generation>();
  const gnutls_datum_t chain = Datum(pem[0]);
  unsigned int length = kMaxChain;
  int rc = gnutls_pcert_list_import_x509_raw(g->chain, &length, &chain, GNUTLS_X509_FMT_PEM, 0);
  if (rc < 0) return fail(absl::StrCat("the certificate chain: ", gnutls_strerror(rc)));
  g->length = length;
  const gnutls_datum_t key = Datum(pem[1]);
  if (gnutls_privkey_init(&g->key) < 0) return fail("out of memory");
  rc = gnutls_privkey_import_x509_raw(g->key, &key, GNUTLS_X509_FMT_PEM, nullptr, 0);
  if (rc < 0) return fail(absl::StrCat("the private key: ", gnutls_strerror(rc)));
  if (!ca_path_.empty()) {
    if (gnutls_x509_trust_list_init(&g->trust, 0) < 0) return fail("out of memory");
    const gnutls_datum_t ca = Datum(pem[2]);
    rc = gnutls_x509_trust_list_add_trust_mem(g->trust, &ca, nullptr, GNUTLS_X509_FMT_PEM, 0, 0);
    if (rc <= 0) {
      return fail(absl::StrCat("the client CA: ", rc < 0 ? gnutls_strerror(rc) : "no certificate"));
    }
    g->ca_pem = std::move(pem[2]);
  }
  return g;
}

bool TlsMaterial::ReloadIfChanged(std::string* problem) {
  problem->clear();
  std::vector<Stamp> now = Stamps();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (now == stamps_) return false;
  }
  // Read outside the lock: handshakes go on with what is served meanwhile.
  absl::StatusOr<std::unique_ptr<Generation>> next = Read();
  std::lock_guard<std::mutex> lock(mu_);
  stamps_ = std::move(now);
  if (!next.ok()) {
    *problem = std::string(next.status().message());
    return true;
  }
  generations_.push_back(*std::move(next));
  return true;
}

void TlsMaterial::Current(gnutls_pcert_st** chain, unsigned int* length,
                          gnutls_privkey_t* key) const {
  std::lock_guard<std::mutex> lock(mu_);
  Generation& g = *generations_.back();
  *chain = g.chain;
  *length = g.length;
  *key = g.key;
}

std::string TlsMaterial::CheckClient(gnutls_session_t session) const {
  unsigned int n = 0;
  const gnutls_datum_t* raw = gnutls_certificate_get_peers(session, &n);
  if (raw == nullptr || n == 0) return "no client certificate was presented";
  n = std::min(n, kMaxChain);
  std::vector<gnutls_x509_crt_t> crts;
  std::string problem;
  for (unsigned int i = 0; i < n && problem.empty(); ++i) {
    gnutls_x509_crt_t crt = nullptr;
    if (gnutls_x509_crt_init(&crt) < 0) return "out of memory";
    crts.push_back(crt);
    const int rc = gnutls_x509_crt_import(crt, &raw[i], GNUTLS_X509_FMT_DER);
    if (rc < 0) problem = absl::StrCat("the client certificate: ", gnutls_strerror(rc));
  }
  unsigned int status = 0;
  if (problem.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    const Generation& g = *generations_.back();
    if (g.trust == nullptr) return "";
    const int rc = gnutls_x509_trust_list_verify_crt2(g.trust, crts.data(),
                                                      static_cast<unsigned int>(crts.size()),
                                                      nullptr, 0, 0, &status, nullptr);
    if (rc < 0) problem = gnutls_strerror(rc);
  }
  for (gnutls_x509_crt_t crt : crts) gnutls_x509_crt_deinit(crt);
  if (!problem.empty() || status == 0) return problem;
  gnutls_datum_t out{};
  if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) < 0) {
    return "the client certificate is not valid";
  }
  std::string why(reinterpret_cast<const char*>(out.data), out.size);
  gnutls_free(out.data);
  return why;
}

}  // namespace taskgrid::http
