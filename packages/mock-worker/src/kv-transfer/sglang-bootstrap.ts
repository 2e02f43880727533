import { Hono } from "hono";
import { openAiError } from "../http/errors.ts";
import type { MockSglangConnector } from "./sglang-connector.ts";
import { ROOM_LIMIT } from "./sglang-params.ts";

/**
 * A prefill-mode worker's bootstrap port (SGLang's `--disaggregation-bootstrap-port`, 8998 by default), where
 * decode servers find a room's KV. SGLang's bootstrap server only brokers the handshake (`/route`: where each
 * prefill rank listens) and the KV then moves over RDMA; the mock hands the room over here instead:
 * `GET /kv/<room>` waits until the prefill has computed the room (the decode's own waiting timeout bounds it)
 * and answers `{bootstrap_room, prompt_tokens, blocks}`, which ends the prefill's wait. `GET /health` as SGLang's.
 */
export function bootstrapRoutes(connector: MockSglangConnector): Hono {
  const app = new Hono();
  app.get("/health", (c) => c.text("OK"));
  app.get("/kv/:room", async (c) => {
    const room = c.req.param("room");
    if (!/^\d{1,40}$/.test(room) || BigInt(room) >= ROOM_LIMIT) return openAiError(c, 400, "the room must be an integer in [0, 2^63)", "room");
    const signal = c.req.raw.signal;
    try {
      return c.json(await connector.take(BigInt(room).toString(), signal));
    } catch (e) {
      // The decode server gave up (its waiting timeout) or went away: nobody reads this answer.
      if (signal.aborted) return c.body(null, 499 as never);
      throw e;
    }
  });
  return app;
}
