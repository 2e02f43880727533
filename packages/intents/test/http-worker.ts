// A worker process for http.test.ts: registers two ranks' intents in the HTTP-served store, then idles
// until killed (its lease stream dies with it).
import { connectHttpDiscovery, registerIntents } from "../src/index.ts";
import { descriptor, HOST, WORKER } from "./fixtures.ts";

const discovery = await connectHttpDiscovery({ url: process.env.STORE_URL!, producer: "worker-proc" });
const owner = await registerIntents({ discovery, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
console.log(`registered ranks ${owner.managedRanks().join(",")}`);
setInterval(() => {}, 1 << 30);
