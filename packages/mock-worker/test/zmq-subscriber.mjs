// Reference subscriber on real libzmq (the `zeromq` package), run under Node because its native addon
// does not load in Bun. Prints one JSON line per message: topic, seq and payload as base64.
// usage: node zmq-subscriber.mjs tcp://HOST:PORT [topic]
import { Subscriber } from "zeromq";

const [endpoint, topic = ""] = process.argv.slice(2);
const sock = new Subscriber();
sock.connect(endpoint);
sock.subscribe(topic);
process.stdout.write(JSON.stringify({ ready: true }) + "\n");
process.on("SIGTERM", () => {
  sock.close();
  process.exit(0);
});
for await (const frames of sock) {
  const [t, seq, payload] = frames;
  process.stdout.write(JSON.stringify({ parts: frames.length, topic: t.toString(), seq: seq.toString("hex"), payload: payload.toString("base64") }) + "\n");
}
