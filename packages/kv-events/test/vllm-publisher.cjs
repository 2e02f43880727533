// A vLLM-like KV-event publisher on libzmq (Node): PUB [topic, seq, payload] plus a replay
// ROUTER answering ["", start_seq] with ["", seq, payload]... and the -1 end marker (the older
// vLLM reply form, without topic). stdin JSON lines: {"payload": hex, "drop": bool} — a dropped
// batch is buffered for replay but never published (a lost message).
const zmq = require("zeromq");
const readline = require("node:readline");
const [pubEp, replayEp] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const buffer = [];
let seq = 0n;
const seqBytes = (s) => {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(s);
  return b;
};

(async () => {
  const pub = new zmq.Publisher({ linger: 0 });
  const router = new zmq.Router({ linger: 0 });
  await pub.bind(pubEp);
  await router.bind(replayEp);
  out({ ready: pub.lastEndpoint, replay: router.lastEndpoint });
  (async () => {
    for await (const [id, empty, start] of router) {
      const from = start.readBigUInt64BE(0);
      let n = 0;
      for (const [s, p] of buffer) if (s >= from) {
        await router.send([id, empty, seqBytes(s), p]);
        n++;
      }
      await router.send([id, empty, seqBytes(-1n), Buffer.alloc(0)]);
      out({ replayed: n, from: String(from) });
    }
  })();
  const queue = [];
  let busy = false;
  readline.createInterface({ input: process.stdin }).on("line", async (line) => {
    queue.push(JSON.parse(line));
    if (busy) return;
    busy = true;
    while (queue.length) {
      const cmd = queue.shift();
      const payload = Buffer.from(cmd.payload, "hex");
      const s = seq++;
      buffer.push([s, payload]);
      if (!cmd.drop) await pub.send([Buffer.alloc(0), seqBytes(s), payload]);
      out({ published: String(s) });
    }
    busy = false;
  });
  process.stdin.on("end", () => process.exit(0));
})();
