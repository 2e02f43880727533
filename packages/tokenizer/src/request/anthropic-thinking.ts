// A Messages body's `thinking` and `output_config.effort` as vLLM's Anthropic server reads them
// (vllm/entrypoints/anthropic/protocol.py, AnthropicThinkingConfig; serving.py, _handle_output_config then
// _handle_thinking). Both end up as the chat's reasoning_effort, which templates read (and which sets their
// enable_thinking): `thinking: {type: "disabled"}` turns a Claude Code turn's prompt into another one.
import { isPyDict, PyNumber } from "../py-values";
import { BadRequest } from "./bad-request";

/** vLLM's AnthropicEffort, output_config.effort's values. */
export const EFFORTS = ["low", "medium", "high", "xhigh", "max"] as const;
/** The reasoning_effort `thinking: {type: "disabled"}` becomes: vLLM's AnthropicDisabledThinkingEffort. */
export type DisabledThinkingEffort = "none" | (typeof EFFORTS)[number];
/** The server's choice of it: an effort, or "auto", which probes the renderer (disabled-thinking-probe.ts). */
export type DisabledThinkingOption = "auto" | DisabledThinkingEffort;
export const DISABLED_THINKING_OPTIONS = ["auto", "none", ...EFFORTS] as const satisfies readonly DisabledThinkingOption[];
/** vLLM's default. */
export const DEFAULT_DISABLED_THINKING: DisabledThinkingOption = "auto";
/** What vLLM's probe answers when "none" cannot be rendered, or renders as some effort would. */
export const UNPROBED_DISABLED_THINKING: DisabledThinkingEffort = "low";

const DISPLAYS = new Set(["summarized", "omitted", "updates"]);

/**
 * The chat's reasoning_effort for a /v1/messages body (not a count_tokens one, whose request has neither field):
 * output_config.effort, then `thinking` over it: "disabled" sets `disabled` (the server's effort for it), "enabled"
 * (a budget, which only caps sampling) and "adaptive" leave it. Throws BadRequest where vLLM's request model refuses
 * either field, as it refuses a budget under 1024 or not below `maxTokens`.
 */
export function chatReasoningEffort(o: Record<string, unknown>, maxTokens: number, disabled: DisabledThinkingEffort): string | undefined {
  const effort = outputEffort(o.output_config);
  return thinkingType(o.thinking, maxTokens) === "disabled" ? disabled : effort;
}

function outputEffort(config: unknown): string | undefined {
  if (config === undefined || config === null) return undefined;
  if (!isPyDict(config)) throw new BadRequest("output_config must be an object");
  const effort = config.effort;
  if (effort === undefined || effort === null) return undefined;
  if (typeof effort !== "string" || !(EFFORTS as readonly string[]).includes(effort)) {
    throw new BadRequest(`output_config.effort must be one of ${EFFORTS.map((e) => `"${e}"`).join(", ")}`);
  }
  return effort;
}

/** The `thinking` config's type, checked as its discriminated union checks each variant. */
function thinkingType(v: unknown, maxTokens: number): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isPyDict(v)) throw new BadRequest("thinking must be an object");
  const { type } = v;
  if (type !== "enabled" && type !== "disabled" && type !== "adaptive") throw new BadRequest('thinking.type must be "enabled", "disabled" or "adaptive"');
  if (type === "disabled") return type;
  const display = v.display;
  if (display !== undefined && display !== null && !(typeof display === "string" && DISPLAYS.has(display))) {
    throw new BadRequest('thinking.display must be "summarized", "omitted" or "updates"');
  }
  if (type === "enabled") {
    const budget = laxInt(v.budget_tokens);
    if (budget === undefined || budget < 1024) throw new BadRequest("thinking.budget_tokens must be an integer of at least 1024");
    if (budget >= maxTokens) throw new BadRequest("thinking.budget_tokens must be less than max_tokens");
  }
  return type;
}

/** An int field as pydantic reads it in lax mode (5, 5.0 or "5"); undefined for anything else. */
export function laxInt(v: unknown): number | undefined {
  const n = v instanceof PyNumber ? v.value : typeof v === "string" && /^\s*[+-]?\d+\s*$/.test(v) ? Number(v) : v;
  return typeof n === "number" && Number.isInteger(n) ? n : undefined;
}
