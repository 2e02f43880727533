import { Hono } from "hono";
import { z } from "zod";
import { parseBody } from "../http/errors.ts";
import type { MockNixlConnector } from "./connector.ts";

/**
 * The mock's side channel for KV transfers: a decode worker that has read a prefill's blocks says so
 * here, and they are freed (what NIXL's notification does between real engines).
 */
const Notify = z.object({ remote_request_id: z.string().min(1) });

export function nixlRoutes(connector: MockNixlConnector): Hono {
  const app = new Hono();
  app.post("/nixl/notify", async (c) => {
    const parsed = await parseBody(c, Notify);
    if (!parsed.ok) return parsed.res;
    // An unknown id is no error of the caller's: the blocks may have been freed by the abort timeout.
    return c.json({ released: connector.read(parsed.data.remote_request_id) });
  });
  return app;
}
