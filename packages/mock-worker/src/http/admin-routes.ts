import { Hono } from "hono";
import { z } from "zod";
import type { Faults, RankParts } from "../faults.ts";
import type { WorkerRole } from "@kv-epp/protocol";
import { cacheTruth } from "./cache-truth.ts";
import { openAiError, parseBody } from "./errors.ts";

/**
 * Test-only switches that break the KV-event stream at runtime (see README "Admin API"), the cache's
 * ground truth (`GET /admin/cache`), and vLLM's `POST /reset_prefix_cache`.
 */

const rank = z.number().int().min(0).optional();
export const FaultRequest = z.discriminatedUnion("action", [
  z.object({ action: z.literal("restart"), rank }),
  z.object({ action: z.literal("skip"), count: z.number().int().min(1), rank }),
  z.object({ action: z.literal("pause"), rank }),
  z.object({ action: z.literal("resume"), rank }),
  z.object({ action: z.literal("drop-cache"), rank }),
]);
export type FaultRequest = z.output<typeof FaultRequest>;

export function adminRoutes(faults: Faults, ranks: readonly RankParts[], role: WorkerRole | undefined): Hono {
  const app = new Hono();

  app.get("/admin/cache", (c) => c.json(cacheTruth(ranks, role)));

  app.get("/admin/faults", (c) => c.json({ ranks: faults.state() }));

  app.post("/admin/faults", async (c) => {
    const parsed = await parseBody(c, FaultRequest);
    if (!parsed.ok) return parsed.res;
    const req = parsed.data;
    if (req.rank !== undefined && req.rank >= faults.dpSize) return openAiError(c, 400, `rank must be < ${faults.dpSize}`, "rank");
    await faults.apply(req);
    return c.json({ ranks: faults.state() });
  });

  app.post("/reset_prefix_cache", (c) => {
    faults.resetPrefixCache();
    return c.body(null, 200);
  });

  return app;
}
