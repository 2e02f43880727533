import { Hono } from "hono";
import { z } from "zod";
import { parseBody } from "../http/errors.ts";
import { TransferRefused, type MockMooncakeConnector } from "./mooncake-connector.ts";

/**
 * A Mooncake prefill worker's bootstrap port (vLLM's MooncakeBootstrapServer on VLLM_MOONCAKE_BOOTSTRAP_PORT, 8998):
 *
 * - `GET /query`: vLLM's answer, `{"<dp rank>": {"engine_id", "worker_addr": {"<tp rank>": {"<pp rank>": addr}},
 *   "pp_size", "tp_size"}}`, one entry per DP rank this worker serves, keyed as its `x-data-parallel-rank` numbers
 *   them. A router (llm-d's sidecar) reads the engine ids; a decode worker, where each engine's worker listens.
 * - `POST /mooncake/transfer` `{transfer_id, engine_id}`: the mock's stand-in for Mooncake's transfer engine (the
 *   ZeroMQ request to `worker_addr` and the RDMA write it triggers). It waits until the prefill on that engine's rank
 *   has finished (up to the abort timeout: 504 `{err_msg: "Timeout waiting for P side ready."}`), frees its blocks
 *   and answers `{transfer_id, prompt_tokens, blocks}`; an engine id not served here is a 404.
 */
const Transfer = z.object({ transfer_id: z.string().min(1), engine_id: z.string().min(1) });

export function mooncakeBootstrapRoutes(connector: MockMooncakeConnector, ranks: readonly number[], key: (rank: number) => number): Hono {
  const app = new Hono();
  app.get("/query", (c) => c.json(connector.query(ranks, key)));
  app.post("/mooncake/transfer", async (c) => {
    const parsed = await parseBody(c, Transfer);
    if (!parsed.ok) return parsed.res;
    const signal = c.req.raw.signal;
    try {
      return c.json(await connector.take(parsed.data.transfer_id, parsed.data.engine_id, ranks, signal));
    } catch (e) {
      if (e instanceof TransferRefused) return c.json({ err_msg: e.message }, e.status);
      if (signal.aborted) return c.body(null, 499 as never);
      throw e;
    }
  });
  return app;
}
