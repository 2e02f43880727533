// The gateway's part of a request, as Envoy with GAIE's ext_proc filter plays it in FULL_DUPLEX_STREAMED
// mode: send the request headers and body to an EPP (the EPP package's ExtProcClient), read the
// destination it sets, send the request to that worker's OpenAI endpoint, then pass the response's
// status and end through the stream (which is how the EPP learns the request finished).
import { ExtProcClient } from "@kv-epp/epp";

export type Routed = { epp: string; endpoint: string; status: number; cachedTokens: number };

const enc = new TextEncoder();

export class Gateway {
  private readonly clients = new Map<string, ExtProcClient>();

  constructor(private readonly opts: { grpcPort?: number } = {}) {}

  private client(eppIp: string): ExtProcClient {
    let c = this.clients.get(eppIp);
    if (!c) {
      c = new ExtProcClient(`${eppIp}:${this.opts.grpcPort ?? 9002}`);
      this.clients.set(eppIp, c);
    }
    return c;
  }

  /** Routes one `/v1/completions` request through the EPP at `eppIp` and sends it to the worker it picks. */
  async completion(eppIp: string, request: { model: string; prompt: string; max_tokens: number }): Promise<Routed> {
    const json = JSON.stringify(request);
    const routed = await this.client(eppIp).route("/v1/completions", enc.encode(json));
    let answered: Routed;
    try {
      const res = await fetch(`http://${routed.endpoint}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: json });
      const answer = (await res.json()) as { usage?: { prompt_tokens_details?: { cached_tokens?: number } } };
      answered = { epp: eppIp, endpoint: routed.endpoint, status: res.status, cachedTokens: answer.usage?.prompt_tokens_details?.cached_tokens ?? 0 };
    } catch (err) {
      // The worker failed: still end the EPP's request (its load), but report the worker's error.
      await routed.finish(502).catch(() => {});
      throw err;
    }
    await routed.finish(answered.status);
    return answered;
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }
}
