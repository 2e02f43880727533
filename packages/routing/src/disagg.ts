// Prefill/decode disaggregation: the two candidate sets a pool's roles make, and the decider that says
// whether a request's prefill runs on a prefill worker or stays on the decode worker it goes to. Pure
// functions; the Picker (picker.ts) runs them between its two picks: the decode rank first (it is the
// destination, so it is chosen whatever the verdict), then, only when the verdict is to disaggregate,
// the prefill rank.
import { decodes, prefills, type WorkerRole } from "@kv-epp/protocol";
import { uncachedTokens } from "./latency.ts";

/**
 * llm-d's example threshold for its prefix-based decider (`nonCachedTokens: 512`): below it, the
 * transfer of a prompt's KV and the extra hop cost about what a local prefill of it does.
 */
export const DEFAULT_PD_THRESHOLD_TOKENS = 512;

/** Why the decider said what it said (`x-kv-epp-decision`'s `pd=` part). */
export type DisaggReason =
  /** The decode rank would compute at least the threshold: a prefill worker does it. */
  | "uncached_over_threshold"
  /** The prompt is short, or the decode rank holds most of it: it prefills locally. */
  | "below_threshold"
  /** The threshold is 0: never disaggregate. */
  | "threshold_off"
  /** The decode side's sidecar sends the request's path to its decode worker whole (PD_SPLIT_PATHS). */
  | "path_not_split"
  /** No prefill-capable rank is eligible other than the decode rank's own worker. */
  | "no_prefill_worker";

export type Disaggregation = {
  disaggregate: boolean;
  reason: DisaggReason;
  /** Tokens the decode rank would prefill itself: the prompt less its cached (or pending) prefix. */
  uncachedTokens: number;
  thresholdTokens: number;
};

/** Split candidates by role: destinations (decode, both, or no role) and prefill ranks (prefill, both). */
export type RoleSets<C> = { decode: C[]; prefill: C[] };

/**
 * The pool's two candidate sets; undefined when no rank may prefill for another (no `prefill` or `both`
 * role), which is the pool as it routed before roles: every rank a destination, nothing disaggregated.
 */
export function roleSets<C extends { readonly role?: WorkerRole }>(candidates: readonly C[]): RoleSets<C> | undefined {
  let any = false;
  for (const c of candidates)
    if (prefills(c.role)) {
      any = true;
      break;
    }
  if (!any) return undefined;
  const sets: RoleSets<C> = { decode: [], prefill: [] };
  for (const c of candidates) {
    if (decodes(c.role)) sets.decode.push(c);
    if (prefills(c.role)) sets.prefill.push(c);
  }
  return sets;
}

export type DeciderInput = {
  promptTokens: number;
  /** Leading blocks the chosen decode rank holds (index or pending). */
  decodeOverlap: number;
  blockSize: number;
  /** 0: never disaggregate. */
  thresholdTokens: number;
  /** Eligible prefill ranks on other workers than the decode rank's. */
  prefillCandidates: number;
  /** False: the sidecar would not split the request's path, so a prefill worker named would never be called. */
  pathSplit?: boolean;
};

/**
 * llm-d's prefix-based P/D rule over this EPP's exact overlap: disaggregate when the tokens the decode
 * rank would compute itself reach the threshold, the request's path is one the sidecar splits, and there
 * is a prefill rank to send them to.
 */
export function decideDisagg(i: DeciderInput): Disaggregation {
  const uncached = uncachedTokens(i.promptTokens, i.decodeOverlap, i.blockSize);
  const verdict = (disaggregate: boolean, reason: DisaggReason): Disaggregation => ({ disaggregate, reason, uncachedTokens: uncached, thresholdTokens: i.thresholdTokens });
  if (i.thresholdTokens <= 0) return verdict(false, "threshold_off");
  if (i.pathSplit === false) return verdict(false, "path_not_split");
  if (uncached < i.thresholdTokens) return verdict(false, "below_threshold");
  if (i.prefillCandidates === 0) return verdict(false, "no_prefill_worker");
  return verdict(true, "uncached_over_threshold");
}
