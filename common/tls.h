// TLS and bearer-token credentials for every Taskgrid process, built from
// PEM files with gRPC's own credentials (no other TLS library).
//
// Servers: ServerCredentials() -> TLS, and mTLS (client certificates
// required and verified against the CA) when a CA is given. Clients
// (taskgridctl, taskgrid-agent, taskgrid-bench): ChannelCredentials() ->
// plaintext when no file is given, TLS when a CA is given, mTLS when a
// certificate and key are given too, plus a bearer token on every call when
// one is given. Errors name the file or the flag at fault. The files are
// read again every TlsFiles::reload_every, so renewed certificates take
// effect without a restart. Thread-safe (no state).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace taskgrid {

// Paths of PEM files; an empty path is "not given".
struct TlsFiles {
  std::string cert;  // this process's certificate (chain)
  std::string key;   // its private key
  std::string ca;    // the CA that signed the peers' certificates
  // How often the files are read again: a renewed certificate (or key, or
  // CA) is used from the next handshake on, without a restart.
  absl::Duration reload_every = absl::Minutes(1);
};

// The contents of a PEM file of the given kind ("certificate", "private
// key", "CA certificate"); `flag` names where the path came from, e.g.
// "--tls_cert". Errors name the flag, the file and what is wrong with it.
absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path,
                                        const std::string& kind);

// TLS with files.cert/files.key (both required); with files.ca every client
// must present a certificate signed by that CA (mTLS).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& files);

// Plaintext when no file and no token are given. Otherwise TLS, verifying
// the server against files.ca (required), presenting files.cert/files.key
// when given (mTLS), and sending "authorization: Bearer <token>" on every
// call when `token` is not empty (a token needs TLS).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, const std::string& token = "");

// The token in the file at `path`, surrounding whitespace trimmed. An empty
// file, or a token with inner whitespace, is an error naming the file.
absl::StatusOr<std::string> ReadToken(const std::string& path);

// The names a verified peer certificate carries: its subject common name and
// its subject alternative names (DNS names, IPs), in that order. Empty for a
// peer without a certificate.
std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& ctx);

}  // namespace taskgrid
