// TlsMaterial: the HTTPS server's certificate chain, private key and client
// CA, read from their files, and read again when the files change, so that
// a renewed certificate (or key, or CA) is served from the next handshake
// on without a restart. Internal to the HTTP server (http_server.cc), which
// hands the current chain and key to GnuTLS per handshake and checks client
// certificates against the current CA.
//
// A reload that finds files it cannot use (half written, a key that does
// not match its certificate) keeps what it had and says what was wrong; it
// is tried again when the files change again. Every generation read stays
// alive until the TlsMaterial goes, as GnuTLS keeps using the chain and key
// it was given for the life of a session; a generation is a few KiB and one
// is added only when the files change.
//
// Thread-safe.
#pragma once

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <sys/stat.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace taskgrid::http {

class TlsMaterial {
 public:
  // Reads cert (a PEM chain), key (PEM) and, when not empty, client_ca
  // (PEM). INVALID_ARGUMENT naming the files and what is wrong with them.
  static absl::StatusOr<std::unique_ptr<TlsMaterial>> Load(const std::string& cert,
                                                           const std::string& key,
                                                           const std::string& client_ca);
  ~TlsMaterial();
  TlsMaterial(const TlsMaterial&) = delete;
  TlsMaterial& operator=(const TlsMaterial&) = delete;

  // Reads the files again when one of them changed (its inode, size or
  // modification time) since the last read. Returns false when nothing
  // changed; true with `*problem` empty when the new files are now served,
  // or with `*problem` saying why the old ones still are.
  bool ReloadIfChanged(std::string* problem);

  // The chain and key to present now. They stay valid while this lives.
  void Current(gnutls_pcert_st** chain, unsigned int* length, gnutls_privkey_t* key) const;

  // "" when the session's client presented a certificate chain the current
  // client CA signed and that is valid now; else what was wrong.
  std::string CheckClient(gnutls_session_t session) const;

  // The client CA as first read (PEM), for the server's certificate
  // request; empty without one.
  const std::string& first_client_ca() const { return first_client_ca_; }

 private:
  struct Generation;
  struct Stamp {
    ino_t inode = 0;
    off_t size = -1;
    timespec modified{};
    bool operator==(const Stamp& o) const;
  };

  TlsMaterial(std::string cert, std::string key, std::string client_ca);
  std::vector<Stamp> Stamps() const;
  // A generation from the files now, or what is wrong with them.
  absl::StatusOr<std::unique_ptr<Generation>> Read() const;

  const std::string cert_path_, key_path_, ca_path_;
  std::string first_client_ca_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Generation>> generations_;  // the last is served
  std::vector<Stamp> stamps_;                             // of the last read
};

}  // namespace taskgrid::http
