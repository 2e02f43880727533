// Runs under Node against a Node bundle of src/index.ts: our publisher → our listener, and
// libzmq PUB → our SubSocket, then prints one JSON line with what arrived.
const zmq = require("zeromq");
const kv = require(process.argv[2]);
const until = async (fn) => {
  for (let i = 0; i < 1000 && !fn(); i++) await new Promise((r) => setTimeout(r, 10));
};

(async () => {
  const pub = await kv.KvEventPublisher.bind({ endpoint: "tcp://127.0.1.7:0", replayEndpoint: "tcp://127.0.1.7:0" });
  const l = new kv.KvEventListener({ workerId: "n", dpRank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint });
  const got = [];
  l.start();
  l.attach((s) => got.push(s));
  const batch = { ts: 1.5, events: [{ type: "BlockStored", blockHashes: [2n ** 64n - 1n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2, loraId: null, medium: "GPU" }], dataParallelRank: 0 };
  await until(() => {
    pub.publish(batch);
    return got.length > 0;
  });

  const zpub = new zmq.Publisher({ linger: 0 });
  await zpub.bind("tcp://127.0.1.7:*");
  const sub = new kv.SubSocket();
  const frames = [];
  sub.onMessage((f) => frames.push(f.map((x) => Buffer.from(x).toString("hex"))));
  sub.subscribe("");
  sub.connect(zpub.lastEndpoint);
  await until(() => {
    zpub.send([Buffer.from("hello"), Buffer.alloc(300, 1)]);
    return frames.length > 0;
  });
  const first = got[0];
  console.log(JSON.stringify({
    listener: { kind: first.kind, hash: first.batch.events[0].blockHashes[0].toString(), connected: l.connected },
    libzmq: frames[0],
  }));
  await l.close();
  await pub.close();
  await sub.close();
  zpub.close();
  process.exit(0);
})().catch((e) => {
  console.log(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
