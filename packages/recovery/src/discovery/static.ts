import type { Logger } from "pino";
import { authHeaders, dumpUrl } from "../dump/client.ts";
import type { Peer } from "../types.ts";
import { ChangeListeners, type PeerDiscovery, sortedPeers } from "./types.ts";

// Static peers (docs/CONTRACTS.md §8 rule 8): a listed peer is eligible only while it is *serving*, i.e. its /dump
// answers 2xx (a cold peer answers 503 until it has recovered). Unreachable, or any other answer (a
// token we do not share, another service on that port), counts as not serving: a peer we cannot dump
// from must not keep two cold replicas waiting on each other.
// So replicas that list each other and start together all see "no serving peer" and bootstrap empty at once
// instead of waiting on each other. The probe is a HEAD, which our /dump answers without generating a body.
// A re-probe that goes unanswered (timed out) is not an answer: a busy peer (one streaming its dump to
// us, on a loaded machine) or a busy us. A serving peer then stays serving for a grace period, as long as
// the dump client itself waits for a silent peer; a refused connection or any answer but 2xx takes it
// out at once.

export type StaticDiscoveryOptions = {
  /** selection-http base URLs, e.g. http://127.0.0.3:9093 */
  peers: string[];
  token?: string;
  /** Per-probe timeout (default 2000 ms): an unanswered probe means "not serving". */
  probeTimeoutMs?: number;
  /** Re-probe period while recovery runs (default 1000 ms); 0 disables polling. */
  pollMs?: number;
  /**
   * How long a serving peer whose re-probes go unanswered still counts as serving (default 30000 ms, the
   * recovery's default no-progress timeout).
   */
  unansweredGraceMs?: number;
  logger: Logger;
};

export function peerFromUrl(url: string): Peer {
  const u = url.replace(/\/+$/, "");
  return { id: u, url: u };
}

type ProbeOutcome = "serving" | "not_serving" | "unanswered";

async function probe(peer: Peer, token: string | undefined, timeoutMs: number, log?: Logger): Promise<ProbeOutcome> {
  try {
    const res = await fetch(dumpUrl(peer), { method: "HEAD", headers: authHeaders(token), signal: AbortSignal.timeout(timeoutMs) });
    await res.body?.cancel().catch(() => {});
    if (res.status === 401 || res.status === 403) log?.warn({ peer: peer.url, status: res.status }, "peer refuses our token (DYN_EPP_PEER_TOKEN differs?)");
    return res.ok ? "serving" : "not_serving";
  } catch (err) {
    return err instanceof Error && err.name === "TimeoutError" ? "unanswered" : "not_serving";
  }
}

export async function probePeer(peer: Peer, token: string | undefined, timeoutMs: number, log?: Logger): Promise<boolean> {
  return (await probe(peer, token, timeoutMs, log)) === "serving";
}

export function staticPeerDiscovery(opts: StaticDiscoveryOptions): PeerDiscovery {
  const listed = sortedPeers(opts.peers.map(peerFromUrl));
  const log = opts.logger.child({ component: "static-peers" });
  const listeners = new ChangeListeners();
  const probeTimeoutMs = opts.probeTimeoutMs ?? 2000;
  const pollMs = opts.pollMs ?? 1000;
  const graceMs = opts.unansweredGraceMs ?? 30_000;
  let serving: Peer[] = [];
  /** Since when each serving peer's re-probes have gone unanswered. */
  const unansweredSince = new Map<string, number>();
  let started: Promise<void> | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let stopped = false;

  const probeAll = async () => {
    const outcomes = await Promise.all(listed.map((p) => probe(p, opts.token, probeTimeoutMs)));
    const now = performance.now();
    const wasServing = new Set(serving.map((p) => p.id));
    const next = listed.filter((p, i) => {
      if (outcomes[i] !== "unanswered") {
        unansweredSince.delete(p.id);
        return outcomes[i] === "serving";
      }
      if (!wasServing.has(p.id)) return false;
      const since = unansweredSince.get(p.id) ?? now;
      unansweredSince.set(p.id, since);
      return now - since < graceMs;
    });
    const changed = next.map((p) => p.id).join("\n") !== serving.map((p) => p.id).join("\n");
    serving = next;
    if (changed) {
      log.info({ serving: next.map((p) => p.id), listed: listed.length }, "static peers re-probed: serving set changed");
      listeners.emit();
    }
  };
  const poll = () => {
    if (stopped || pollMs <= 0) return;
    timer = setTimeout(() => void probeAll().finally(poll), pollMs);
    timer.unref?.();
  };

  return {
    description: `static peers [${listed.map((p) => p.id).join(", ")}]`,
    start() {
      started ??= (async () => {
        // The first probe says why a peer refuses us; the re-probes after it stay quiet.
        const up = await Promise.all(listed.map((p) => probePeer(p, opts.token, probeTimeoutMs, log)));
        serving = listed.filter((_, i) => up[i]);
        log.info({ serving: serving.map((p) => p.id), listed: listed.length }, "static peers probed");
        poll();
      })();
      return started;
    },
    peers: () => serving,
    onChange: (cb) => listeners.add(cb),
    async stop() {
      stopped = true;
      if (timer !== null) clearTimeout(timer);
    },
  };
}
