// Which shape of `content` a chat template gets, decided from the template as vLLM decides it
// (vllm/renderers/hf.py `_detect_content_format`, with `--chat-template-content-format auto`):
// "openai" when the template loops over a message's content (`{% for part in message['content'] %}`, the
// message being a loop variable over `messages` or over a variable set from it), else "string".

export type ContentFormat = "string" | "openai";

/** vLLM's `--chat-template-content-format`: "auto" detects the format from the template, the others force it. */
export type ContentFormatOption = "auto" | ContentFormat;
export const CONTENT_FORMAT_OPTIONS = ["auto", "string", "openai"] as const satisfies readonly ContentFormatOption[];

type Node = { type: string; [k: string]: unknown };

function isNode(x: unknown): x is Node {
  return typeof x === "object" && x !== null && typeof (x as Node).type === "string";
}

/** Every node of the tree, parents first (jinja2's find_all over the whole template, macros included). */
export function* walk(n: unknown): Generator<Node> {
  if (Array.isArray(n)) {
    for (const x of n) yield* walk(x);
    return;
  }
  if (!isNode(n)) return;
  yield n;
  for (const [k, v] of Object.entries(n)) if (k !== "type" && typeof v === "object") yield* walk(v);
}

const isName = (n: unknown, name: string): boolean => isNode(n) && n.type === "Identifier" && n.value === name;

/** `name.key` or `name['key']`. */
function isKeyOf(n: Node, name: string, key: string): boolean {
  if (n.type !== "MemberExpression" || !isName(n.object, name)) return false;
  const p = n.property as Node;
  return n.computed ? p.type === "StringLiteral" && p.value === key : p.type === "Identifier" && p.value === key;
}

/** `name` (or `name.key`), possibly filtered, tested or sliced: what vLLM counts as reading that variable. */
export function reads(n: unknown, name: string, key?: string): boolean {
  if (!isNode(n)) return false;
  if (n.type === "FilterExpression" || n.type === "TestExpression") return reads(n.operand, name, key);
  if (n.type === "SelectExpression") return reads(n.lhs, name, key);
  if (n.type === "MemberExpression" && n.computed && isNode(n.property) && n.property.type === "SliceExpression") return reads(n.object, name, key);
  return key === undefined ? isName(n, name) : isKeyOf(n, name, key);
}

/** `messages` and every variable set from it, transitively. */
function messagesNames(root: Node): string[] {
  const names = ["messages"];
  const sets = [...walk(root)].filter((n) => n.type === "Set" && isNode(n.assignee) && n.assignee.type === "Identifier");
  for (let i = 0; i < names.length; i++) {
    for (const s of sets) {
      const lhs = (s.assignee as Node).value as string;
      if (reads(s.value, names[i]!) && !names.includes(lhs)) names.push(lhs);
    }
  }
  return names;
}

function loopVar(f: Node): string | undefined {
  return isNode(f.loopvar) && f.loopvar.type === "Identifier" ? (f.loopvar.value as string) : undefined;
}

export function detectContentFormat(ast: unknown): ContentFormat {
  if (!isNode(ast)) return "string";
  const loops = [...walk(ast)].filter((n) => n.type === "For");
  const lists = messagesNames(ast);
  const messageVars = loops.filter((f) => lists.some((m) => reads(f.iterable, m))).map(loopVar).filter((v) => v !== undefined);
  return loops.some((f) => messageVars.some((m) => reads(f.iterable, m, "content"))) ? "openai" : "string";
}
