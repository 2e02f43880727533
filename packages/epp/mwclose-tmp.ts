import { KvEventListener, KvEventPublisher } from "@kv-epp/kv-events";
const pub = await KvEventPublisher.bind({ endpoint: "tcp://127.0.7.6:0" });
const l = new KvEventListener({ workerId: "w", dpRank: 0, endpoint: pub.endpoint }); l.start();
await Bun.sleep(Number(process.argv[2]));
let t = Date.now();
await pub.close();
console.log("delay", process.argv[2], "connected", l.connected, "pub closed in", Date.now() - t);
await l.close();
