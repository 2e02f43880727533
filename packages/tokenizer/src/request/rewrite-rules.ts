// InferenceModelRewrite rules where a body is read: which rule applies to the model a body names, and the
// target it is sent as, picked by weight (llm-d's Director.applyWeightedModelRewrite). The body's model is
// known only once the body is read, in a pool member or on the event loop, so the rules go there with the
// body: a plain object (a Map of the few models rules name) that crosses threads with each job.

/** A rule's target, as the InferenceModelRewrite API writes it. */
export type TargetModel = { modelRewrite: string; weight?: number | null };

/** The rule that applies to a model: the InferenceModelRewrite it comes from, and its targets. */
export type RuleTargets = { rewrite: string; targets: readonly TargetModel[] };

/** The pool's rules, precedence settled: the winning rule per exact model, and the winning generic rule. */
export type RewriteRules = { exact: ReadonlyMap<string, RuleTargets>; generic?: RuleTargets };

/**
 * The model a body naming `model` is sent as, when a rule applies: an exact match over the generic rule (which
 * applies to a body naming none too, as llm-d looks up the empty name). `target` is "" for a rule without
 * targets, which llm-d answers with 400 ("model not found in request body").
 */
export function ruleTarget(rules: RewriteRules, model: string | undefined, random: () => number = Math.random): { target: string; rewrite: string } | undefined {
  const rule = (model !== undefined ? rules.exact.get(model) : undefined) ?? rules.generic;
  return rule && { target: weightedTarget(rule.targets, random), rewrite: rule.rewrite };
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
