// libzmq reference peer for interop tests (runs under Node with the `zeromq` package).
// argv: <PUB|SUB|ROUTER|DEALER> <bind|connect> <endpoint> [maxMsgSize]
// stdin JSON lines:  {"send": [hex...]} | {"subscribe": hex} | {"echo": true} | {"close": true}
// stdout JSON lines: {"ready": endpoint} | {"msg": [hex...]}
const zmq = require("zeromq");
const readline = require("node:readline");

const [role, mode, endpoint] = process.argv.slice(2);
const ctor = { PUB: zmq.Publisher, SUB: zmq.Subscriber, ROUTER: zmq.Router, DEALER: zmq.Dealer }[role];
const sock = new ctor({ linger: 0 });
let echo = false;
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

async function main() {
  if (mode === "bind") await sock.bind(endpoint);
  else sock.connect(endpoint);
  out({ ready: sock.lastEndpoint || endpoint });
  if (role !== "PUB") {
    (async () => {
      for await (const msg of sock) {
        if (echo) await sock.send(msg);
        out({ msg: msg.map((f) => Buffer.from(f).toString("hex")) });
      }
    })().catch((e) => out({ error: String(e) }));
  }
}

const queue = [];
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const cmd = queue.shift();
    if (cmd.send) await sock.send(cmd.send.map((h) => Buffer.from(h, "hex")));
    if (cmd.subscribe !== undefined) sock.subscribe(Buffer.from(cmd.subscribe, "hex"));
    if (cmd.echo) echo = true;
    if (cmd.close) {
      sock.close();
      process.exit(0);
    }
    if (cmd.sendMany) {
      const frames = cmd.sendMany.frames.map((h) => Buffer.from(h, "hex"));
      for (let i = 0; i < cmd.sendMany.count; i++) await sock.send(frames);
    }
    out({ done: true });
  }
  busy = false;
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  queue.push(JSON.parse(line));
  pump().catch((e) => out({ error: String(e) }));
});
process.stdin.on("end", () => process.exit(0));
main().catch((e) => {
  out({ error: String(e) });
  process.exit(1);
});
