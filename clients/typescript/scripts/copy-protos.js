// Copies proto/taskgrid/v1/*.proto of the checkout into ./proto, which the
// package ships and loads at run time (@grpc/proto-loader), so the client
// always speaks the API of the checkout it was built from.
const fs = require("fs");
const path = require("path");

const from = path.join(__dirname, "..", "..", "..", "proto", "taskgrid", "v1");
const to = path.join(__dirname, "..", "proto", "taskgrid", "v1");
if (!fs.existsSync(from)) {
  // An installed copy of the package: its protos came with it.
  if (fs.existsSync(to)) process.exit(0);
  console.error(`copy-protos: ${from} not found (build from a Taskgrid checkout)`);
  process.exit(1);
}
fs.rmSync(path.join(__dirname, "..", "proto"), { recursive: true, force: true });
fs.mkdirSync(to, { recursive: true });
for (const f of fs.readdirSync(from).filter((f) => f.endsWith(".proto"))) {
  fs.copyFileSync(path.join(from, f), path.join(to, f));
}
