// What SGLang does to a chat that is not mirrored here, detected so that such a chat is routed by load
// (ChatUnrenderable, counted) instead of hashed as a prompt the workers never see.
import { isMediaPart } from "./media";
import { ChatUnrenderable } from "./messages";
import { isPyDict } from "./py-values";
import type { ConversationTemplate } from "./sglang-conversation";
import type { ChatMessage, ContentPart } from "./types";

type Dict = Record<string, unknown>;

const STANDARD_TYPES = new Set(["null", "boolean", "object", "array", "number", "string", "integer"]);

/**
 * normalize_json_schema_types (function_call/utils.py) rewrites a tool schema's non-standard `type` names
 * (`varchar` -> `string`, `int64` -> `integer`, ...) before the template prints the tools, from a table of aliases
 * and prefixes that changes with SGLang. A schema naming any type outside JSON Schema's seven is not mirrored.
 */
export function checkSchemaTypes(tools: readonly unknown[] | undefined, messages: readonly ChatMessage[]): void {
  const all = [...(tools ?? []), ...messages.flatMap((m) => (Array.isArray(m.tools) ? m.tools : []))];
  for (const t of all) {
    const parameters = isPyDict(t) && isPyDict(t.function) ? t.function.parameters : undefined;
    if (hasNonStandardType(parameters, 0))
      throw new ChatUnrenderable("SGLang rewrites a tool schema's non-standard type names (normalize_json_schema_types): not mirrored here");
  }
}

// The keywords normalize_json_schema_types walks into, as it does: a map's values, a list's items, or one schema
// (a list there too). Nothing else is a schema to it: a property named `type`, an `example`, an `x-` extension.
const SCHEMA_MAPS = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
const SCHEMA_LISTS = ["anyOf", "oneOf", "allOf", "prefixItems"];
const SCHEMAS = ["items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties"];

function hasNonStandardType(schema: unknown, depth: number): boolean {
  if (depth > 64) return true;
  if (Array.isArray(schema)) return schema.some((s) => hasNonStandardType(s, depth + 1));
  if (!isPyDict(schema)) return false;
  const t = schema.type;
  if (typeof t === "string" && !STANDARD_TYPES.has(t)) return true;
  // A list is deduplicated after rewriting, so a repeated name changes it too.
  if (Array.isArray(t) && (t.some((x) => typeof x === "string" && !STANDARD_TYPES.has(x)) || new Set(t).size !== t.length)) return true;
  const nested = (v: unknown) => hasNonStandardType(v, depth + 1);
  return SCHEMA_MAPS.some((k) => isPyDict(schema[k]) && Object.values(schema[k]).some(nested)) ||
    SCHEMA_LISTS.some((k) => Array.isArray(schema[k]) && schema[k].some(nested)) ||
    SCHEMAS.some((k) => Object.hasOwn(schema, k) && nested(schema[k]));
}

/**
 * _apply_jinja_template: a template whose detected reasoning config has an effort kwarg (Nemotron 3 Super's
 * `low_effort`) gets it set true for reasoning_effort "low" where the kwargs do not name it. The detection is
 * SGLang's (detect_reasoning_pattern); a template that names `low_effort` at all is taken to have it. `effort`: the
 * request's reasoning_effort, which SGLang tests (a kwargs' reasoning_effort may give the template another).
 */
export function checkEffortKwarg(source: string, effort: unknown, vars: Dict): void {
  if (effort === "low" && source.includes("low_effort") && !Object.hasOwn(vars, "low_effort"))
    throw new ChatUnrenderable("SGLang sets the template's low_effort kwarg for reasoning_effort \"low\" (reasoning_config.effort_kwarg): not mirrored here");
}

/**
 * _canonicalize_tool_message_order: for a template that may reorder tool results, a run of tool results holding
 * media is sorted into its assistant's tool_calls order (when each id is there once). A run that sorting would
 * change is not mirrored (whether the template is such a one is SGLang's detection).
 */
export function checkToolResultOrder(messages: readonly ChatMessage[]): void {
  for (let i = 0; i < messages.length; i++) {
    const calls = roleOf(messages[i]!) === "assistant" ? messages[i]!.tool_calls : undefined;
    if (!Array.isArray(calls) || calls.length === 0) continue;
    let end = i + 1;
    while (end < messages.length && (roleOf(messages[end]!) === "tool" || roleOf(messages[end]!) === "function")) end++;
    const run = messages.slice(i + 1, end);
    if (run.length < 2 || !run.some(hasMedia)) continue;
    // A null id is None to SGLang (`call_id is None`): no id.
    const order: unknown[] = calls.map((c) => (isPyDict(c) ? (c.id ?? undefined) : undefined));
    const positions = run.map((m) => order.indexOf(m.tool_call_id));
    // Ids missing, repeated or unknown: SGLang leaves the run as it is.
    if (new Set(order).size !== order.length || order.includes(undefined) || new Set(positions).size !== positions.length || positions.includes(-1)) continue;
    if (positions.some((p, k) => k > 0 && p < positions[k - 1]!))
      throw new ChatUnrenderable("SGLang may reorder tool results holding media into the tool calls' order: not mirrored here");
  }
}

// SGLang sorts the messages as dumped, their roles lowercased.
const roleOf = (m: ChatMessage) => (typeof m.role === "string" ? m.role.toLowerCase() : m.role);

const hasMedia = (m: ChatMessage) => Array.isArray(m.content) && (m.content as ContentPart[]).some((p) => isPyDict(p) && isMediaPart(p));

/**
 * ChatRenderer.render: a server with a conversation template (sglang-conversation.ts) renders every chat through
 * _apply_conversation_template, SGLang's Python formatting, which is not mirrored here.
 */
export function checkJinjaRendered(conversation: ConversationTemplate | undefined): void {
  if (conversation !== undefined)
    throw new ChatUnrenderable(`SGLang renders this model's chats with its conversation template ${JSON.stringify(conversation.name)} (${conversation.why}), not a Jinja template: not mirrored here`);
}
