// This test run's own loopback range. Tests give every process its own 127.x.y.z address with the
// standard ports; two runs at once (several checkouts on one machine) would collide on those
// addresses, and a test could even talk to the other run's processes. So each run claims a second
// octet S and its tests use 127.S.y.z: the claim is a socket this process keeps listening on
// 127.S.255.254 (the kernel arbitrates: exactly one live process holds it, and it is released when the
// process exits, however it ends). Children inherit the claim through the environment.
import { createServer, type Server } from "node:net";

const ENV = "KV_EPP_TEST_LOOPBACK";
const CLAIM_PORT = 47_999;

function listen(host: string): Promise<Server | null> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(null));
    srv.listen({ host, port: CLAIM_PORT, exclusive: true }, () => resolve(srv));
  });
}

async function claim(): Promise<string> {
  const inherited = process.env[ENV];
  if (inherited && /^127\.\d{1,3}$/.test(inherited)) return inherited;
  // 127.0.* is left to everything else on the machine (127.0.0.1, 127.0.0.53, 127.0.1.1).
  const first = 1 + Math.floor(Math.random() * 254);
  for (let k = 0; k < 254; k++) {
    const s = 1 + ((first - 1 + k) % 254);
    const srv = await listen(`127.${s}.255.254`);
    if (srv === null) continue;
    srv.unref();
    const range = `127.${s}`;
    process.env[ENV] = range;
    return range;
  }
  throw new Error("no free loopback range 127.1-254.*.* for this test run");
}

/**
 * The first two octets of this run's loopback addresses, e.g. "127.42": a test's address is
 * `${LOOPBACK}.8.11` (the third octet keeps one package's tests apart from another's).
 */
export const LOOPBACK: string = await claim();

/** `LOOPBACK` as a regular-expression source (its dot escaped), for patterns matching an address. */
export const LOOPBACK_PATTERN: string = LOOPBACK.replace(".", "\\.");
