// Bench publisher (Node child, libzmq): XPUB with noDrop so send() awaits at the HWM instead of
// dropping; same frames as ours.
const zmq = require("zeromq");
const { readFileSync } = require("node:fs");
const [file, totalArg] = process.argv.slice(2);
const total = Number(totalArg);
const raw = readFileSync(file);
const payloads = [];
for (let off = 0; off < raw.length; ) {
  const n = raw.readUInt32BE(off);
  payloads.push(raw.subarray(off + 4, off + 4 + n));
  off += 4 + n;
}
(async () => {
  const pub = new zmq.XPublisher({ noDrop: true, sendHighWaterMark: 2000, linger: 1000 });
  await pub.bind("tcp://127.0.1.9:*");
  console.log(JSON.stringify({ endpoint: pub.lastEndpoint }));
  await pub.receive(); // the subscription
  const topic = Buffer.from("kv");
  for (let seq = 0; seq < total; seq++) {
    const s = Buffer.alloc(8);
    s.writeBigUInt64BE(BigInt(seq));
    const msg = [topic, s, payloads[seq % payloads.length]];
    // XPUB noDrop reports EAGAIN at the HWM without a writable wake-up; back off and retry.
    for (;;) {
      try {
        await pub.send(msg);
        break;
      } catch (e) {
        if (e.code !== "EAGAIN") throw e;
        await new Promise((r) => setTimeout(r, 1));
      }
    }
  }
  setTimeout(() => pub.close(), 1000);
})();
