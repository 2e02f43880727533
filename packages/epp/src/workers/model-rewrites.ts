// InferenceModelRewrites, as llm-d's router applies them (datastore/modelrewritestore.go,
// Director.applyWeightedModelRewrite): the rewrites in the pool's namespace whose spec.poolRef names
// this pool map the model a request's body names to a target model, picked by weight. The rule is
// looked up by the body's model, and its target replaces the x-llm-d-model-name-rewrite header's
// (llm-d applies the rule after reading the header).
import type { KubernetesObject } from "@kubernetes/client-node";
import { forPool, watchLlmdResource, type LlmdWatchOptions, type PoolRef } from "./llmd-resources.ts";

export type TargetModel = { modelRewrite: string; weight?: number | null };
export type RewriteRule = { matches?: { model?: { type?: string; value: string } | null }[] | null; targets?: TargetModel[] | null };
export type InferenceModelRewrite = KubernetesObject & { spec?: { poolRef?: PoolRef | null; rules?: RewriteRule[] | null } };

type Ranked = { rule: RewriteRule; rewrite: string; created: number; index: number };

/**
 * Precedence as llm-d's store: a rule naming the model exactly over a generic one (no `matches`), then
 * the oldest resource (creationTimestamp). Ties llm-d leaves to its unstable sort are settled here by
 * the resource's name, then the rule's place in its list (the API's "first matching rule").
 */
const byPrecedence = (a: Ranked, b: Ranked) => a.created - b.created || (a.rewrite < b.rewrite ? -1 : a.rewrite > b.rewrite ? 1 : 0) || a.index - b.index;

/** The rule lookup requests read, replaced on every change of the watched set. */
export class ModelRewrites {
  private exact = new Map<string, Ranked[]>();
  private generic: Ranked[] = [];

  /** The pool's rewrites (others, and those being deleted, are skipped). */
  setWatched(items: readonly InferenceModelRewrite[], poolName: string): void {
    const exact = new Map<string, Ranked[]>();
    const generic: Ranked[] = [];
    for (const o of items) {
      if (!forPool(o, poolName)) continue;
      const created = Date.parse(String(o.metadata?.creationTimestamp ?? "")) || 0;
      (o.spec?.rules ?? []).forEach((rule, index) => {
        const r = { rule, rewrite: o.metadata!.name!, created, index };
        if (!rule.matches?.length) return void generic.push(r);
        // A match without a model matches nothing (llm-d's exactModels skips it).
        for (const model of new Set(rule.matches.flatMap((m) => (m.model ? [m.model.value] : [])))) {
          const list = exact.get(model);
          if (list) list.push(r);
          else exact.set(model, [r]);
        }
      });
    }
    for (const list of exact.values()) list.sort(byPrecedence);
    this.exact = exact;
    this.generic = generic.sort(byPrecedence);
  }

  /** The rule for a body's model, and the resource it comes from. */
  rule(model: string): { rule: RewriteRule; rewrite: string } | undefined {
    const r = this.exact.get(model)?.[0] ?? this.generic[0];
    return r && { rule: r.rule, rewrite: r.rewrite };
  }

  /**
   * The model a request whose body names `model` is sent as, when a rule applies (undefined: none
   * does, the header's rewrite or the body's model stands). `target` is "" for a rule without targets,
   * which llm-d answers with 400 ("model not found in request body").
   */
  target(model: string, random: () => number = Math.random): { target: string; rewrite: string } | undefined {
    const found = this.rule(model);
    return found && { target: weightedTarget(found.rule.targets ?? [], random), rewrite: found.rewrite };
  }
}

/**
 * llm-d's selectWeightedModel: a target is picked with probability weight / sum of the weights set;
 * with weights mixed, an unweighted target is never picked; with none set, all are equally likely.
 */
export function weightedTarget(targets: readonly TargetModel[], random: () => number): string {
  if (targets.length === 0) return "";
  const total = targets.reduce((n, t) => n + (t.weight ?? 0), 0);
  if (total === 0) return targets[Math.floor(random() * targets.length)]!.modelRewrite;
  const r = Math.floor(random() * total);
  let at = 0;
  for (const t of targets) {
    at += t.weight ?? 0;
    if (r < at) return t.modelRewrite;
  }
  return targets.at(-1)!.modelRewrite;
}

export type ModelRewriteWatchOptions = Omit<LlmdWatchOptions<InferenceModelRewrite>, "plural" | "onSnapshot"> & { poolName: string; into: ModelRewrites; onChange?: () => void };

/** Follows the pool's InferenceModelRewrites (watchLlmdResource) into `into`. */
export function startModelRewriteWatch(o: ModelRewriteWatchOptions): { stop(): Promise<void> } {
  return watchLlmdResource<InferenceModelRewrite>({
    ...o,
    plural: "inferencemodelrewrites",
    onSnapshot: (items) => {
      o.into.setWatched(items, o.poolName);
      o.onChange?.();
    },
  });
}
