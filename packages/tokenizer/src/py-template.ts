// A chat template rendered by @huggingface/jinja with Python's semantics where vLLM's renderer (jinja2 under
// transformers' apply_chat_template) and the library part ways, each measured against Python jinja2 3.1:
//   - values print as Python's str(): None, True/False, 1.0, {'a': 1}, ['x'] (the library prints null, true, 1,
//     {"a": 1});
//   - `tojson` is transformers' json.dumps(x, ensure_ascii=False, indent, separators, sort_keys): floats keep
//     their fraction (`1.0`), indent/separators as Python lays them out;
//   - str.strip/lstrip/rstrip(chars) and the `trim` filter remove only `chars` (the library ignores the argument
//     and trims JavaScript's whitespace set);
//   - `~` and `|string` use str(); `|join` joins str() of the items;
//   - an undefined value is jinja2's default Undefined: it prints "" (and is falsy, and `is defined` false), but an
//     attribute or item of it raises UndefinedError and `tojson` of it json.dumps' TypeError (TemplateRaised, the
//     request's error); where the library's undefined may not be jinja2's, it keeps the library's behaviour.
// @huggingface/jinja 0.5.13 (latest) has the same gaps, so they are closed here, at our boundary: an Interpreter
// subclass that evaluates those few node kinds itself and defers every other one to the library.
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import { PyFloat, pyFloatRepr, PyInt, pyStrip, pyStrRepr } from "./py-values";

type Value = { type: string; value: unknown };
type ValueClass = new (value?: unknown) => Value;
type Node = { type: string; [k: string]: unknown };
type Env = Environment;

// The library's value classes are not exported; Environment.set hands back an instance of each.
const probe = new Environment();
let probes = 0;
const classOf = (v: unknown) => (probe.set(`v${probes++}`, v) as unknown as Value).constructor as ValueClass;
const StringValue = classOf("");
const IntegerValue = classOf(1);
const FloatValue = classOf(0.5);
const BooleanValue = classOf(true);
const NullValue = classOf(null);
const UndefinedValue = classOf(undefined);
const ArrayValue = classOf([]);
const ObjectValue = classOf({});

/** A request value as the template sees it; PyFloat becomes a float, other numbers by their integrality. */
export function toTemplateValue(v: unknown): Value {
  if (v instanceof PyFloat) return new FloatValue(v.value);
  if (v instanceof PyInt) return Object.assign(new IntegerValue(v.value), { digits: v.digits });
  if (Array.isArray(v)) return new ArrayValue(v.map(toTemplateValue));
  if (typeof v === "number") return Number.isInteger(v) ? new IntegerValue(v) : new FloatValue(v);
  if (typeof v === "string") return new StringValue(v);
  if (typeof v === "boolean") return new BooleanValue(v);
  if (v === null) return new NullValue(null);
  if (v === undefined) return new UndefinedValue();
  if (typeof v === "object") return new ObjectValue(new Map(Object.entries(v).map(([k, x]) => [k, toTemplateValue(x)])));
  return probe.set(`v${probes++}`, v) as unknown as Value;
}

const items = (v: Value) => v.value as Value[];
const entries = (v: Value) => [...(v.value as Map<string, Value>)];

/** str(v) in Python. */
export function pyStr(v: Value): string {
  if (v.type === "StringValue") return v.value as string;
  if (v.type === "UndefinedValue") return "";
  return pyRepr(v);
}

/** repr(v) in Python (what containers print for their items). */
export function pyRepr(v: Value): string {
  switch (v.type) {
    case "StringValue":
      return pyStrRepr(v.value as string);
    case "IntegerValue":
      // A big integer from the request prints as written (PyInt), as Python's int does.
      return (v as { digits?: string }).digits ?? (Number.isSafeInteger(v.value) ? String(v.value) : BigInt(v.value as number).toString());
    case "FloatValue":
      return pyFloatRepr(v.value as number);
    case "BooleanValue":
      return v.value ? "True" : "False";
    case "NullValue":
      return "None";
    case "UndefinedValue":
      return "";
    case "TupleValue": {
      const xs = items(v).map(pyRepr);
      return xs.length === 1 ? `(${xs[0]},)` : `(${xs.join(", ")})`;
    }
    case "ArrayValue":
      return `[${items(v).map(pyRepr).join(", ")}]`;
    case "ObjectValue":
    case "KeywordArgumentsValue":
      return `{${entries(v).map(([k, x]) => `${pyStrRepr(k)}: ${pyRepr(x)}`).join(", ")}}`;
    case "NamespaceValue":
      return `<Namespace {${entries(v).map(([k, x]) => `${pyStrRepr(k)}: ${pyRepr(x)}`).join(", ")}}>`;
    default:
      return String(v);
  }
}

type JsonOptions = { ensureAscii: boolean; indent: string | null; itemSep: string; keySep: string; sortKeys: boolean };

/** json.dumps as transformers' `tojson` filter calls it. */
export function pyJsonDumps(v: Value, o: JsonOptions, depth = 0): string {
  switch (v.type) {
    case "NullValue":
    case "UndefinedValue":
      return "null";
    case "BooleanValue":
      return v.value ? "true" : "false";
    case "IntegerValue":
      return pyRepr(v);
    case "FloatValue": {
      const x = v.value as number;
      return Number.isNaN(x) ? "NaN" : Number.isFinite(x) ? pyFloatRepr(x) : x > 0 ? "Infinity" : "-Infinity";
    }
    case "StringValue":
      return jsonString(v.value as string, o.ensureAscii);
    case "ArrayValue":
    case "TupleValue":
      return container("[", "]", items(v).map((x) => pyJsonDumps(x, o, depth + 1)), o, depth);
    case "ObjectValue":
    case "KeywordArgumentsValue":
    case "NamespaceValue": {
      let kv = entries(v);
      if (o.sortKeys) kv = kv.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      return container("{", "}", kv.map(([k, x]) => `${jsonString(k, o.ensureAscii)}${o.keySep}${pyJsonDumps(x, o, depth + 1)}`), o, depth);
    }
    default:
      throw new Error(`Object of type ${v.type} is not JSON serializable`);
  }
}

function container(open: string, close: string, parts: string[], o: JsonOptions, depth: number): string {
  if (parts.length === 0) return open + close;
  if (o.indent === null) return open + parts.join(o.itemSep) + close;
  const inner = "\n" + o.indent.repeat(depth + 1);
  return open + inner + parts.join(o.itemSep + inner) + "\n" + o.indent.repeat(depth) + close;
}

function jsonString(s: string, ensureAscii: boolean): string {
  const j = JSON.stringify(s);
  // Python's ensure_ascii escapes everything outside printable ASCII (DEL included), as \uXXXX in lowercase.
  return ensureAscii ? j.replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`) : j;
}

// Statements whose result is their own output (a block's text) or nothing; every other node in a block is an
// expression whose value is printed with str().
const STATEMENTS = new Set(["Set", "If", "For", "Macro", "CallStatement", "FilterStatement", "Break", "Continue", "Comment", "Program"]);
const STRIPS: Record<string, "both" | "left" | "right"> = { strip: "both", lstrip: "left", rstrip: "right" };

// Undefined values are jinja2's default Undefined, as transformers' sandbox has them: printed "", but an attribute or
// item of one raises UndefinedError and `tojson` of one raises json.dumps' TypeError (SGLang retries a failed
// render with flat tools on exactly these). They raise here only where the library's undefined is surely jinja2's:
// a variable, a dict's missing key, a list's missing index, an attribute of None. Elsewhere (a Python method the
// library lacks) jinja2 has a value, and the library's own behaviour stays.
const SURELY_UNDEFINED_IN = new Set(["ObjectValue", "NullValue", "ArrayValue"]);

class PythonInterpreter extends Interpreter {
  /** The value type of each node evaluated as a member expression's object. */
  private readonly objectTypes = new WeakMap<object, string>();
  private readonly objects = new WeakSet<object>();

  override evaluate(node: Parameters<Interpreter["evaluate"]>[0], env: Env): ReturnType<Interpreter["evaluate"]> {
    const n = node as unknown as Node | undefined;
    if (n?.type === "MemberExpression") this.objects.add(n.object as object);
    const own = n === undefined ? undefined : this.python(n, env);
    const v = (own ?? super.evaluate(node, env)) as unknown as Value;
    if (n !== undefined && this.objects.has(n)) {
      this.objectTypes.set(n, v.type);
      if (v.type === "UndefinedValue" && this.jinjaUndefined(n)) throw new TemplateRaised(`${nodeName(n)} is undefined`);
    }
    return v as unknown as ReturnType<Interpreter["evaluate"]>;
  }

  /** Whether an undefined value of `n` is jinja2's Undefined too (see SURELY_UNDEFINED_IN). */
  private jinjaUndefined(n: Node): boolean {
    if (n.type === "Identifier") return true;
    return n.type === "MemberExpression" && SURELY_UNDEFINED_IN.has(this.objectTypes.get(n.object as object) ?? "");
  }

  private value(n: unknown, env: Env): Value {
    return this.evaluate(n as never, env) as unknown as Value;
  }

  /** The nodes evaluated with Python semantics; undefined hands the node to the library. */
  private python(n: Node, env: Env): Value | undefined {
    if (n.type === "BinaryExpression" && (n.operator as { value: string }).value === "~") {
      return new StringValue(pyStr(this.value(n.left, env)) + pyStr(this.value(n.right, env)));
    }
    if (n.type === "FilterExpression") return this.filter(n, env);
    if (n.type === "CallExpression") {
      const callee = n.callee as Node;
      const method = callee.type === "MemberExpression" && !callee.computed ? ((callee.property as Node).value as string) : undefined;
      if (method === undefined || !(method in STRIPS)) return undefined;
      const target = this.value(callee.object, env);
      if (target.type !== "StringValue") return undefined;
      const [chars] = this.args(n.args as Node[], env).positional;
      return new StringValue(pyStrip(target.value as string, charsOf(chars, method), STRIPS[method]!));
    }
    return undefined;
  }

  private filter(n: Node, env: Env): Value | undefined {
    const f = n.filter as Node;
    const name = (f.type === "Identifier" ? f.value : (f.callee as Node).value) as string;
    if (!["tojson", "string", "trim", "join"].includes(name)) return undefined;
    const operand = this.value(n.operand, env);
    const { positional, keyword } = f.type === "CallExpression" ? this.args(f.args as Node[], env) : { positional: [], keyword: new Map<string, Value>() };
    const arg = (i: number, key: string) => keyword.get(key) ?? positional[i];
    switch (name) {
      case "tojson":
        if (operand.type === "UndefinedValue" && this.jinjaUndefined(n.operand as Node)) throw new TemplateRaised("Object of type Undefined is not JSON serializable");
        return new StringValue(pyJsonDumps(operand, jsonOptions(arg(0, "ensure_ascii"), arg(1, "indent"), arg(2, "separators"), arg(3, "sort_keys"))));
      case "string":
        return new StringValue(pyStr(operand));
      case "trim":
        if (operand.type !== "StringValue") return undefined;
        return new StringValue(pyStrip(operand.value as string, charsOf(arg(0, "chars"), "trim"), "both"));
      case "join": {
        if (operand.type !== "ArrayValue" && operand.type !== "TupleValue") return undefined;
        if (keyword.has("attribute")) return undefined;
        const sep = arg(0, "d");
        return new StringValue(items(operand).map(pyStr).join(sep === undefined ? "" : pyStr(sep)));
      }
    }
    return undefined;
  }

  private args(nodes: Node[], env: Env): { positional: Value[]; keyword: Map<string, Value> } {
    const positional: Value[] = [];
    const keyword = new Map<string, Value>();
    for (const a of nodes) {
      if (a.type === "KeywordArgumentExpression") keyword.set((a.key as Node).value as string, this.value(a.value, env));
      else positional.push(this.value(a, env));
    }
    return { positional, keyword };
  }
}

// Output of a block: str() of each expression, as jinja2 prints it (None prints "None"); statements (set, if,
// for, macro, ...) are left to the library, one at a time. The library declares the block method private (and
// 0.5.13 renamed it renderBlock, returning a string), so it is replaced on the prototype of our subclass.
const libraryBlock = Interpreter.prototype as unknown as Record<string, (statements: Node[], env: Env) => unknown>;
const BLOCK = typeof libraryBlock.renderBlock === "function" ? "renderBlock" : "evaluateBlock";
const libraryRender = libraryBlock[BLOCK]!;
Object.defineProperty(PythonInterpreter.prototype, BLOCK, {
  value(this: PythonInterpreter, statements: Node[], env: Env): unknown {
    let out = "";
    for (const s of statements) {
      if (STATEMENTS.has(s.type)) {
        const r = libraryRender.call(this, [s], env);
        out += typeof r === "string" ? r : String((r as Value).value);
      } else out += pyStr(this.evaluate(s as never, env) as unknown as Value);
    }
    return BLOCK === "renderBlock" ? out : new StringValue(out);
  },
});

/** A name for an undefined value's expression, as jinja2's message gives it. */
function nodeName(n: Node): string {
  if (n.type === "Identifier") return `'${n.value as string}'`;
  const p = n.property as Node | undefined;
  return p?.type === "Identifier" || p?.type === "StringLiteral" ? `'${p.value as string}'` : "value";
}

function charsOf(v: Value | undefined, what: string): string | null {
  if (v === undefined || v.type === "NullValue" || v.type === "UndefinedValue") return null;
  if (v.type !== "StringValue") throw new Error(`${what} arg must be None or str`);
  return v.value as string;
}

function jsonOptions(ensureAscii?: Value, indent?: Value, separators?: Value, sortKeys?: Value): JsonOptions {
  const set = (v?: Value) => v !== undefined && v.type !== "NullValue" && v.type !== "UndefinedValue";
  const ind = !set(indent) ? null : indent!.type === "StringValue" ? (indent!.value as string) : " ".repeat(Number(indent!.value));
  let itemSep = ind === null ? ", " : ",";
  let keySep = ": ";
  if (set(separators)) [itemSep, keySep] = items(separators!).map((x) => x.value as string) as [string, string];
  const truthy = (v?: Value) => set(v) && Boolean(v!.value);
  return { ensureAscii: truthy(ensureAscii), indent: ind, itemSep, keySep, sortKeys: truthy(sortKeys) };
}

/**
 * An error jinja2 raises too, on this template and these values (raise_exception, an undefined value used, a sandbox
 * limit): the request's fault, as the engines answer it.
 */
export class TemplateRaised extends Error {}

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/** transformers' strftime_now: datetime.now().strftime(format), local time, C locale names. */
function strftimeNow(format: string): string {
  const d = new Date();
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  return format.replace(/%[a-zA-Z%]/g, (t) => {
    switch (t) {
      case "%Y": return String(d.getFullYear());
      case "%y": return pad(d.getFullYear() % 100);
      case "%m": return pad(d.getMonth() + 1);
      case "%d": return pad(d.getDate());
      case "%e": return String(d.getDate()).padStart(2, " ");
      case "%b": return MONTHS[d.getMonth()]!.slice(0, 3);
      case "%B": return MONTHS[d.getMonth()]!;
      case "%a": return DAYS[d.getDay()]!.slice(0, 3);
      case "%A": return DAYS[d.getDay()]!;
      case "%H": return pad(d.getHours());
      case "%I": return pad(d.getHours() % 12 || 12);
      case "%p": return d.getHours() < 12 ? "AM" : "PM";
      case "%M": return pad(d.getMinutes());
      case "%S": return pad(d.getSeconds());
      case "%j": return pad(Math.floor((d.getTime() - new Date(d.getFullYear(), 0, 1).getTime()) / 86_400_000) + 1, 3);
      case "%%": return "%";
      default: return t;
    }
  });
}

/**
 * jinja2's sandbox (transformers renders chat templates in one) refuses a range longer than this: a template, a
 * request's own under --trust-request-chat-template included, cannot ask for a billion-element list.
 */
const MAX_RANGE = 100_000;

function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error("range() arg 3 must not be zero");
  if (Math.ceil((stop - start) / step) > MAX_RANGE) throw new TemplateRaised(`Range too big. The sandbox blocks ranges larger than MAX_RANGE (${MAX_RANGE}).`);
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

/** A parsed chat template rendered with Python semantics. */
export class PyTemplate {
  private readonly program: Template["parsed"];

  constructor(source: string) {
    // jinja2's lexer writes every newline of the template's text and string literals as its newline_sequence
    // ("\n"): a template with CRLF (a config's string, a file) renders as with LF.
    this.program = new Template(source.replace(/\r\n?/g, "\n")).parsed;
  }

  /** The template's syntax tree (read by the content-format detection). */
  get ast(): Template["parsed"] {
    return this.program;
  }

  render(vars: Record<string, unknown>): string {
    const env = new Environment();
    // The globals transformers' environment has; jinja2's true/false/none literals resolve as variables here.
    for (const [k, v] of [["true", true], ["false", false], ["none", null], ["True", true], ["False", false], ["None", null]] as const) env.set(k, v);
    env.set("raise_exception", (message: unknown) => {
      throw new TemplateRaised(String(message));
    });
    env.set("range", range);
    env.set("strftime_now", strftimeNow);
    for (const [k, v] of Object.entries(vars)) env.setVariable(k, toTemplateValue(v) as never);
    const out = new PythonInterpreter(env).run(this.program) as unknown as Value;
    return out.value as string;
  }
}
