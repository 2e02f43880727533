// GAIE's request headers (llm-d-router pkg/epp/metadata: the x-llm-d-* names, with the x-gateway-*
// ones as their older aliases): the model name to score for, the objective (a priority), and the
// fairness id. Read once per request from its headers.
import { findHeader, type HeaderMap } from "./messages.ts";

const MODEL_REWRITE = ["x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite"];
const OBJECTIVE = ["x-llm-d-inference-objective", "x-gateway-inference-objective"];
const FAIRNESS_ID = ["x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id"];
/** GAIE's id for requests that name none. */
export const DEFAULT_FAIRNESS_ID = "default-flow";

export type RequestClass = {
  /** The model the request is scored for (the rewrite wins over the body's `model`). */
  modelRewrite: string | undefined;
  /** Negative: sheddable (GAIE's InferenceObjective priority < 0). */
  priority: number;
  fairnessId: string;
};

function first(map: HeaderMap | undefined, names: readonly string[]): string | undefined {
  for (const n of names) {
    const v = findHeader(map, n)?.trim();
    if (v) return v;
  }
  return undefined;
}

/**
 * The objective names an InferenceObjective, whose priority is given here by `--objective-priorities`
 * (name=priority); one not named there is 0, as llm-d's router treats an objective it does not know. A number is a
 * name like any other: were it its own priority, any client could send a high one and skip the shedding.
 */
export function requestClass(headers: HeaderMap | undefined, priorities: ReadonlyMap<string, number>): RequestClass {
  const objective = first(headers, OBJECTIVE);
  const priority = objective === undefined ? 0 : priorities.get(objective) ?? 0;
  return { modelRewrite: first(headers, MODEL_REWRITE), priority, fairnessId: first(headers, FAIRNESS_ID) ?? DEFAULT_FAIRNESS_ID };
}

/**
 * Admission under saturation, lower priorities first. A sheddable request (priority < 0) gets its 429
 * from SHEDDABLE_SHARE of --max-inflight on, and whenever every worker is over --queue-threshold. When
 * some objective has a positive priority (`criticalKnown`), a standard request (priority 0) gets its 429
 * from STANDARD_SHARE on, so the last slots of the cap go to critical traffic; otherwise standard
 * requests run up to the cap itself, as without objectives. Critical requests are refused only at the cap.
 */
export const SHEDDABLE_SHARE = 0.8;
export const STANDARD_SHARE = 0.9;

export function shedReason(c: { priority: number; inflight: number; maxInflight: number; queuesFull: boolean; criticalKnown: boolean }): string | undefined {
  if (c.priority < 0) {
    if (c.queuesFull) return "sheddable request: every worker's queue is over --queue-threshold";
    if (c.maxInflight > 0 && c.inflight >= Math.floor(c.maxInflight * SHEDDABLE_SHARE)) return "sheddable request: in-flight requests past 80% of --max-inflight";
  }
  if (c.priority === 0 && c.criticalKnown && c.maxInflight > 0 && c.inflight >= Math.floor(c.maxInflight * STANDARD_SHARE))
    return "standard request: in-flight requests past 90% of --max-inflight, the rest is kept for critical objectives";
  if (c.maxInflight > 0 && c.inflight >= c.maxInflight) return "too many requests in flight";
  return undefined;
}

/** Whether any configured objective is critical (priority > 0), which reserves the top of the cap for it. */
export function hasCriticalObjective(priorities: ReadonlyMap<string, number>): boolean {
  for (const p of priorities.values()) if (p > 0) return true;
  return false;
}

/**
 * Label values a client chooses (a fairness id, a model name): bounded in number and length, so a client inventing
 * them cannot grow the series without end. Past `max` distinct values, a new one is "other" (as llm-d's router).
 * Pinned values (configured model names) are always themselves and take no place in `max`, so invented names cannot
 * crowd a served model into "other" (llm-d's PreAdmitModelLabels). A pin is never taken back: a running request's
 * gauge is decremented under the label it was incremented under.
 */
export class BoundedLabels {
  private readonly seen = new Set<string>();
  private readonly pinned = new Set<string>();
  constructor(private readonly max = 64, private readonly maxLength = 64) {}

  label(id: string): string {
    const v = this.cut(id);
    if (this.pinned.has(v) || this.seen.has(v)) return v;
    if (this.seen.size >= this.max) return "other";
    this.seen.add(v);
    return v;
  }

  pin(ids: Iterable<string>): void {
    for (const id of ids) if (id !== "") this.pinned.add(this.cut(id));
  }

  private cut(id: string): string {
    return id.length > this.maxLength ? id.slice(0, this.maxLength) : id;
  }
}
