// InferenceModelRewrites, as llm-d's router keeps them (datastore/modelrewritestore.go): the rewrites in the
// pool's namespace whose spec.poolRef names this pool map the model a request's body names to a target model,
// picked by weight. The rule is looked up by the body's model where the body is read (@kv-epp/tokenizer's
// rewrite-rules.ts, Director.applyWeightedModelRewrite), and its target replaces the
// x-llm-d-model-name-rewrite header's (llm-d applies the rule after reading the header). Followed by
// startModelRewriteWatch (llmd-resources.ts).
import type { KubernetesObject } from "@kubernetes/client-node";
import { type RewriteRules, type RuleTargets, type TargetModel } from "@kv-epp/tokenizer";
import { forPool, type PoolRef } from "./pool-ref.ts";

export type RewriteRule = { matches?: { model?: { type?: string; value: string } | null }[] | null; targets?: TargetModel[] | null };
export type InferenceModelRewrite = KubernetesObject & { spec?: { poolRef?: PoolRef | null; rules?: RewriteRule[] | null } };

type Ranked = { rule: RewriteRule; rewrite: string; created: number; index: number };

/**
 * Precedence as llm-d's store: a rule naming the model exactly over a generic one (no `matches`), then
 * the oldest resource (creationTimestamp). Ties llm-d leaves to its unstable sort are settled here by
 * the resource's name, then the rule's place in its list (the API's "first matching rule").
 */
const byPrecedence = (a: Ranked, b: Ranked) => a.created - b.created || (a.rewrite < b.rewrite ? -1 : a.rewrite > b.rewrite ? 1 : 0) || a.index - b.index;

/** The pool's rules, as requests' bodies are read with them (readBody's rewriteRules), replaced on every change of the watched set. */
export class ModelRewrites {
  private snapshot: RewriteRules | undefined;
  private names: readonly string[] = [];

  /** The pool's rewrites (others, and those being deleted, are skipped). */
  setWatched(items: readonly InferenceModelRewrite[], poolName: string): void {
    const exact = new Map<string, Ranked[]>();
    const generic: Ranked[] = [];
    const names = new Set<string>();
    for (const o of items) {
      if (!forPool(o, poolName)) continue;
      const created = Date.parse(String(o.metadata?.creationTimestamp ?? "")) || 0;
      (o.spec?.rules ?? []).forEach((rule, index) => {
        const r = { rule, rewrite: o.metadata!.name!, created, index };
        for (const m of rule.matches ?? []) if (m.model) names.add(m.model.value);
        for (const t of rule.targets ?? []) names.add(t.modelRewrite);
        if (!rule.matches?.length) return void generic.push(r);
        // A match without a model matches nothing (llm-d's exactModels skips it).
        for (const model of new Set(rule.matches.flatMap((m) => (m.model ? [m.model.value] : [])))) {
          const list = exact.get(model);
          if (list) list.push(r);
          else exact.set(model, [r]);
        }
      });
    }
    // Only each model's winner goes with the bodies: the lookup where they are read is one Map get.
    const winner = (list: Ranked[]): RuleTargets => {
      const r = list.sort(byPrecedence)[0]!;
      return { rewrite: r.rewrite, targets: r.rule.targets ?? [] };
    };
    this.snapshot = exact.size === 0 && generic.length === 0 ? undefined : {
      exact: new Map([...exact].map(([model, list]) => [model, winner(list)])),
      ...(generic.length > 0 ? { generic: winner(generic) } : {}),
    };
    this.names = [...names];
  }

  /**
   * The model names the pool's rules match and rewrite to, every rule's (llm-d's configuredModelNames): labels kept
   * from the bound on client-chosen names. The same array until the watched set changes.
   */
  modelNames(): readonly string[] {
    return this.names;
  }

  /** The rules to read a body with; undefined when the pool has none (nothing crosses with the body). */
  rules(): RewriteRules | undefined {
    return this.snapshot;
  }
}
