// A chat template rendered by @huggingface/jinja with Python's semantics where vLLM's renderer (jinja2 under
// transformers' apply_chat_template) and the library part ways, each measured against Python jinja2 3.1:
//   - values print as Python's str(): None, True/False, 1.0, {'a': 1}, ['x'] (the library prints null, true, 1,
//     {"a": 1});
//   - `tojson` is transformers' json.dumps(x, ensure_ascii=False, indent, separators, sort_keys): floats keep
//     their fraction (`1.0`), indent/separators as Python lays them out;
//   - str.strip/lstrip/rstrip(chars) and the `trim` filter remove only `chars` (the library ignores the argument
//     and trims JavaScript's whitespace set);
//   - `~` and `|string` use str(); `|join` joins str() of the items (or of their `attribute`, which the library
//     ignores);
//   - a dict's items(), the `items` filter and `dictsort` give (key, value) tuples, printed `('a', 1)` (the library's
//     lists print `['a', 1]`); keys(), values() and items() are views, printed `dict_keys(['a'])`, which `tojson`
//     refuses and `list` makes a list; the `items` filter gives a generator, as jinja2's do_items (see GENERATORS);
//   - `==`, `!=` and `in`/`not in` over a list compare as Python does (pyEquals), where the library uses JavaScript's
//     `==` (containers by identity, "1" == 1 true) and `===` for membership;
//   - an undefined value is jinja2's default Undefined: it prints "" (and is falsy, and `is defined` false), but an
//     attribute or item of it raises UndefinedError and `tojson` of it json.dumps' TypeError (TemplateRaised, the
//     request's error); where the library's undefined may not be jinja2's, it keeps the library's behaviour.
// @huggingface/jinja (0.5.11, the version installed; 0.5.13 too) has the same gaps, so they are closed here, at our boundary: an Interpreter
// subclass that evaluates those few node kinds itself and defers every other one to the library. It also bounds each
// render's work (RenderBound), which neither jinja2 nor the library does.
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

/** str(v) in Python; a container's text past `limit` characters throws RenderBoundExceeded. */
export function pyStr(v: Value, limit = Infinity): string {
  if (v.type === "StringValue") return v.value as string;
  if (v.type === "UndefinedValue") return "";
  return pyRepr(v, limit);
}

/** repr(v) in Python (what containers print for their items), within `limit` characters as pyStr. */
export function pyRepr(v: Value, limit = Infinity): string {
  const repr = (x: Value) => pyRepr(x, limit);
  const pair = ([k, x]: [string, Value]) => `${pyStrRepr(k)}: ${repr(x)}`;
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
    case "TupleValue":
    case "ArrayValue": {
      if (GENERATORS.has(v)) throw new Error("a generator (the items filter's) prints with its memory address in jinja2: not reproducible here");
      const xs = joinWithin(items(v), repr, ", ", limit);
      if (v.type === "TupleValue" || TUPLES.has(v)) return items(v).length === 1 ? `(${xs},)` : `(${xs})`;
      const view = VIEWS.get(v);
      return view === undefined ? `[${xs}]` : `${view}([${xs}])`;
    }
    case "ObjectValue":
    case "KeywordArgumentsValue":
      return `{${joinWithin(entries(v), pair, ", ", limit)}}`;
    case "NamespaceValue":
      return `<Namespace {${joinWithin(entries(v), pair, ", ", limit)}}>`;
    default:
      return String(v);
  }
}

/**
 * `each` of `xs` joined by `sep`; throws RenderBoundExceeded as soon as the text passes `limit` characters, so a
 * container holding one big value many times (`[s, s]` nested n deep is 2^n copies) is never built whole.
 */
function joinWithin<T>(xs: readonly T[], each: (x: T) => string, sep: string, limit: number): string {
  const parts: string[] = [];
  let length = 0;
  for (const x of xs) {
    const part = each(x);
    length += part.length + sep.length;
    if (length > limit) throw new RenderBoundExceeded("characters");
    parts.push(part);
  }
  return parts.join(sep);
}

type JsonOptions = { ensureAscii: boolean; indent: string | null; itemSep: string; keySep: string; sortKeys: boolean; limit: number };

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
      if (GENERATORS.has(v)) throw new TemplateRaised("Object of type generator is not JSON serializable");
      if (VIEWS.has(v)) throw new TemplateRaised(`Object of type ${VIEWS.get(v)} is not JSON serializable`);
      return container("[", "]", items(v), (x) => pyJsonDumps(x, o, depth + 1), o, depth);
    case "ObjectValue":
    case "KeywordArgumentsValue":
    case "NamespaceValue": {
      let kv = entries(v);
      if (o.sortKeys) kv = kv.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      return container("{", "}", kv, ([k, x]) => `${jsonString(k, o.ensureAscii)}${o.keySep}${pyJsonDumps(x, o, depth + 1)}`, o, depth);
    }
    default:
      throw new Error(`Object of type ${v.type} is not JSON serializable`);
  }
}

function container<T>(open: string, close: string, xs: readonly T[], each: (x: T) => string, o: JsonOptions, depth: number): string {
  if (xs.length === 0) return open + close;
  if (o.indent === null) return open + joinWithin(xs, each, o.itemSep, o.limit) + close;
  if (o.indent.length * (depth + 1) > o.limit) throw new RenderBoundExceeded("characters");
  const inner = "\n" + o.indent.repeat(depth + 1);
  return open + inner + joinWithin(xs, each, o.itemSep + inner, o.limit) + "\n" + o.indent.repeat(depth) + close;
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

// str.startswith / str.endswith as Python answers them, evaluated here for every call on a string. The library's
// differ (it ignores start and end, takes a list for a tuple, and fails otherwise than jinja2 on other types), and
// build a table of every string method for each string a method is called on (templates test each message's
// content): an eighth of a chat's render.
const AFFIXES = new Set(["startswith", "endswith"]);

/**
 * The affix a string or a tuple of strings, then start and end as slice indices (int, bool or None) counted in code
 * points, positional only; anything else raises Python's TypeError. As CPython's tailmatch: the indices are
 * clamped as a slice's, except that a start past the end matches nothing, not even "".
 */
function affixTest(target: Value, method: string, positional: Value[], keyword: Map<string, Value>): Value {
  if (keyword.size > 0) throw new TemplateRaised(`${method}() takes no keyword arguments`);
  if (positional.length < 1 || positional.length > 3) throw new TemplateRaised(`${method}() takes at least 1 argument and at most 3 (${positional.length} given)`);
  const [affix, start, end] = positional as [Value, Value?, Value?];
  const tuple = affix.type === "TupleValue" || (affix.type === "ArrayValue" && TUPLES.has(affix));
  if (!tuple && affix.type !== "StringValue") throw new TemplateRaised(`${method} first arg must be str or a tuple of str`);
  const affixes = tuple ? items(affix) : [affix];
  const own = target.value as string;
  // Python counts code points. UTF-16 offsets are the same where no surrogate is; only slice indices need a string
  // walked as code points (an O(n) copy, which a template's plain test of a long message must not pay: see unitMatch).
  const indexed = (start !== undefined && start.type !== "NullValue") || (end !== undefined && end.type !== "NullValue");
  const wide = indexed && (SURROGATE.test(own) || affixes.some((a) => a.type === "StringValue" && SURROGATE.test(a.value as string)));
  const str: ArrayLike<string> = wide ? Array.from(own) : own;
  const n = str.length;
  let lo = sliceIndex(start, 0, method);
  let hi = sliceIndex(end, n, method);
  if (hi > n) hi = n;
  else if (hi < 0) hi = Math.max(hi + n, 0);
  if (lo < 0) lo = Math.max(lo + n, 0);
  const matches = (text: string): boolean => {
    if (!wide) return unitMatch(own, text, lo, hi, method === "startswith");
    const sub = Array.from(text);
    const last = hi - sub.length;
    if (last < lo) return false;
    const at = method === "startswith" ? lo : last;
    for (let i = 0; i < sub.length; i++) if (str[at + i] !== sub[i]) return false;
    return true;
  };
  // In order, as Python: a tuple's item that is not a str raises only when no item before it matched.
  for (const a of affixes) {
    if (a.type !== "StringValue") throw new TemplateRaised(`tuple for ${method} must only contain str`);
    if (matches(a.value as string)) return new BooleanValue(true);
  }
  return new BooleanValue(false);
}

const SURROGATE = /[\uD800-\uDFFF]/;

/**
 * `text` at the start (or end) of own[lo:hi] in UTF-16 units, as Python's code points would have it: a match that
 * splits a surrogate pair of `own` at either edge is half a code point matched by a lone surrogate, which Python's
 * comparison of code points never matches.
 */
function unitMatch(own: string, text: string, lo: number, hi: number, atStart: boolean): boolean {
  const last = hi - text.length;
  if (last < lo) return false;
  const at = atStart ? lo : last;
  if (!own.startsWith(text, at)) return false;
  const end = at + text.length;
  const splits = (i: number) => i > 0 && i < own.length && isHigh(own.charCodeAt(i - 1)) && isLow(own.charCodeAt(i));
  return text.length === 0 || (!splits(at) && !splits(end));
}

const isHigh = (c: number) => c >= 0xd800 && c <= 0xdbff;
const isLow = (c: number) => c >= 0xdc00 && c <= 0xdfff;

/** A slice index argument: an int (a bool is one), or None / absent for `fallback`. */
function sliceIndex(v: Value | undefined, fallback: number, method: string): number {
  if (v === undefined || v.type === "NullValue") return fallback;
  if (v.type === "IntegerValue") return v.value as number;
  if (v.type === "BooleanValue") return v.value ? 1 : 0;
  throw new TemplateRaised(`${method}: slice indices must be integers or None or have an __index__ method`);
}

// Undefined values are jinja2's default Undefined, as transformers' sandbox has them: printed "", but an attribute or
// item of one raises UndefinedError and `tojson` of one raises json.dumps' TypeError (SGLang retries a failed
// render with flat tools on exactly these). They raise here only where the library's undefined is surely jinja2's:
// a variable, a dict's missing key, a list's missing index, an attribute of None. Elsewhere (a Python method the
// library lacks) jinja2 has a value, and the library's own behaviour stays.
const SURELY_UNDEFINED_IN = new Set(["ObjectValue", "NullValue", "ArrayValue"]);

// The nodes whose value may be a string or list built anew (not one held by a variable): its size is what they cost.
const BUILDS = new Set(["BinaryExpression", "FilterExpression", "CallExpression"]);

// The filters evaluated here (where Python's differ from the library's, or may raise where the library's do not).
const OWN_FILTERS = new Set(["tojson", "string", "trim", "join", "replace", "indent", "dictsort", "items", "list", "length", "count", "last", "capitalize"]);

// Filters that read none of a list or string but its length or an end (templates take `messages|length` per message).
const CONSTANT_FILTERS = new Set(["length", "count", "first", "last", "default", "d"]);

/**
 * The children of a node whose values it reads whole (an operator's or filter's operands, a method's string or list,
 * a loop's list, for which the library makes a scope per item before the first): their size is what reading costs.
 */
function readWhole(n: Node): unknown[] {
  switch (n.type) {
    case "BinaryExpression":
      return [n.left, n.right];
    case "FilterExpression": {
      const f = n.filter as Node;
      return CONSTANT_FILTERS.has((f.type === "Identifier" ? f.value : (f.callee as Node).value) as string) ? [] : [n.operand];
    }
    case "CallExpression":
      return (n.callee as Node).type === "MemberExpression" ? [(n.callee as Node).object] : [];
    case "For":
      return [n.iterable, (n.iterable as Node).lhs];
    default:
      return [];
  }
}

// What a node's evaluation checks of it, fixed by the syntax tree (each node has one parent, evaluated before it):
// worked out on a node's first evaluation and kept with it, so a render does not redo it per node (a chat's render
// evaluates thousands). ANALYZED: its children are marked; READ_WHOLE: its parent reads its value whole (readWhole);
// OBJECT: it is a member expression's (or a method call's) object; BUILT: its value is built anew (BUILDS, a slice).
const ANALYZED = 1;
const READ_WHOLE = 2;
const OBJECT = 4;
const BUILT = 8;
const FACTS = new WeakMap<object, number>();

function markFact(n: object, fact: number): void {
  FACTS.set(n, (FACTS.get(n) ?? 0) | fact);
}

function factsOf(n: Node): number {
  const known = FACTS.get(n) ?? 0;
  if ((known & ANALYZED) !== 0) return known;
  if (n.type === "MemberExpression") markFact(n.object as object, OBJECT);
  for (const child of readWhole(n)) if (child !== undefined) markFact(child as object, READ_WHOLE);
  const built = BUILDS.has(n.type) || (n.property as Node | undefined)?.type === "SliceExpression" ? BUILT : 0;
  const facts = known | ANALYZED | built;
  FACTS.set(n, facts);
  return facts;
}

class PythonInterpreter extends Interpreter {
  /** The value type of each node evaluated as a member expression's object. */
  private readonly objectTypes = new WeakMap<object, string>();
  private steps = 0;
  private chars = 0;
  // What python() evaluated of a node it then leaves to the library (a method's object, a filter's operand, their
  // arguments): the library evaluates those again, in the same environment, and is handed the value instead, so each
  // is evaluated, and counted against the bound, once. `holding` lists them innermost last, each node's released when
  // the node is done.
  private readonly held = new Map<object, { env: Env; value: Value }>();
  private readonly holding: object[] = [];

  constructor(env: Env, private readonly bound: RenderBound) {
    super(env);
  }

  get cost(): { steps: number; chars: number } {
    return { steps: this.steps, chars: this.chars };
  }

  /** The characters (or items) the render may still build or read. */
  get charsLeft(): number {
    return this.bound.chars - this.chars;
  }

  /** Counts what a value built or read whole costs; past the bound the render stops. */
  spend(size: number): void {
    this.chars += size;
    if (this.chars > this.bound.chars) throw new RenderBoundExceeded("characters");
  }

  override evaluate(node: Parameters<Interpreter["evaluate"]>[0], env: Env): ReturnType<Interpreter["evaluate"]> {
    const n = node as unknown as Node | undefined;
    const held = n === undefined ? undefined : this.held.get(n);
    if (held !== undefined && held.env === env) {
      this.held.delete(n!);
      return held.value as unknown as ReturnType<Interpreter["evaluate"]>;
    }
    if (++this.steps > this.bound.steps) throw new RenderBoundExceeded("evaluation steps");
    const facts = n === undefined ? 0 : factsOf(n);
    const mark = this.holding.length;
    let v: Value;
    try {
      const own = n === undefined ? undefined : this.python(n, env);
      v = (own ?? super.evaluate(node, env)) as unknown as Value;
    } finally {
      while (this.holding.length > mark) this.held.delete(this.holding.pop()!);
    }
    if ((facts & (BUILT | READ_WHOLE)) !== 0) this.spend(sizeOf(v));
    if (n !== undefined && (facts & OBJECT) !== 0) {
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

  /** `n`'s value, held for the library should python() leave `n`'s parent to it. */
  private value(n: unknown, env: Env): Value {
    const v = this.evaluate(n as never, env) as unknown as Value;
    this.held.set(n as object, { env, value: v });
    this.holding.push(n as object);
    return v;
  }

  /** The nodes evaluated with Python semantics; undefined hands the node to the library. */
  private python(n: Node, env: Env): Value | undefined {
    if (n.type === "BinaryExpression") {
      const op = (n.operator as { value: string }).value;
      if (op === "~") return new StringValue(pyStr(this.value(n.left, env), this.charsLeft) + pyStr(this.value(n.right, env), this.charsLeft));
      if (op === "==" || op === "!=") {
        const equal = pyEquals(this.value(n.left, env), this.value(n.right, env), () => this.spend(1));
        return equal === undefined ? undefined : new BooleanValue(equal === (op === "=="));
      }
      if (op === "in" || op === "not in") {
        const left = this.value(n.left, env);
        const right = this.value(n.right, env);
        if (right.type !== "ArrayValue" && right.type !== "TupleValue") return undefined;
        const found = items(right).some((x) => pyEquals(left, x, () => this.spend(1)) === true);
        return new BooleanValue(found === (op === "in"));
      }
      return undefined;
    }
    if (n.type === "FilterExpression") return this.filter(n, env);
    if (n.type === "CallExpression") {
      const callee = n.callee as Node;
      const method = callee.type === "MemberExpression" && !callee.computed ? ((callee.property as Node).value as string) : undefined;
      if (method === undefined || !(method in STRIPS || method === "replace" || DICT_VIEWS.has(method) || AFFIXES.has(method))) return undefined;
      // The callee's object, as the library would mark it evaluating the callee (an undefined one raises).
      markFact(callee.object as object, OBJECT);
      const target = this.value(callee.object, env);
      if (DICT_VIEWS.has(method)) return target.type === "ObjectValue" && (n.args as Node[]).length === 0 ? dictView(target, method) : undefined;
      if (target.type !== "StringValue") return undefined;
      const { positional, keyword } = this.args(n.args as Node[], env);
      if (AFFIXES.has(method)) return affixTest(target, method, positional, keyword);
      if (method === "replace") return this.replace(target, positional, keyword);
      return new StringValue(pyStrip(target.value as string, charsOf(positional[0], method), STRIPS[method]!));
    }
    return undefined;
  }

  private filter(n: Node, env: Env): Value | undefined {
    const f = n.filter as Node;
    const name = (f.type === "Identifier" ? f.value : (f.callee as Node).value) as string;
    if (!OWN_FILTERS.has(name)) return undefined;
    const operand = this.value(n.operand, env);
    if (GENERATORS.has(operand)) {
      if (name === "tojson") throw new TemplateRaised("Object of type generator is not JSON serializable");
      if (name === "length" || name === "count") throw new TemplateRaised("object of type 'generator' has no len()");
      if (name === "last") throw new TemplateRaised("'generator' object is not reversible");
    }
    const { positional, keyword } = f.type === "CallExpression" ? this.args(f.args as Node[], env) : { positional: [], keyword: new Map<string, Value>() };
    const arg = (i: number, key: string) => keyword.get(key) ?? positional[i];
    switch (name) {
      case "tojson":
        if (operand.type === "UndefinedValue" && this.jinjaUndefined(n.operand as Node)) throw new TemplateRaised("Object of type Undefined is not JSON serializable");
        return new StringValue(pyJsonDumps(operand, jsonOptions(this.charsLeft, arg(0, "ensure_ascii"), arg(1, "indent"), arg(2, "separators"), arg(3, "sort_keys"))));
      case "string":
        return new StringValue(pyStr(operand, this.charsLeft));
      case "trim":
        if (operand.type !== "StringValue") return undefined;
        return new StringValue(pyStrip(operand.value as string, charsOf(arg(0, "chars"), "trim"), "both"));
      case "join": {
        if (operand.type !== "ArrayValue" && operand.type !== "TupleValue") return undefined;
        const attribute = keyword.get("attribute");
        const values = attribute === undefined ? items(operand) : attributes(items(operand), attribute);
        const sep = arg(0, "d");
        return new StringValue(joinWithin(values, (x) => pyStr(x, this.charsLeft), sep === undefined ? "" : pyStr(sep), this.charsLeft));
      }
      case "replace":
        return operand.type === "StringValue" ? this.replace(operand, positional, keyword) : undefined;
      case "indent": {
        if (operand.type !== "StringValue") return undefined;
        // Each line gets the indent: width times the lines, built at once by the library. Checked here, then left to
        // the library.
        const width = arg(0, "width");
        const lines = (operand.value as string).split("\n").length;
        if (width?.type === "IntegerValue" && (width.value as number) * lines > this.charsLeft) throw new RenderBoundExceeded("characters");
        return undefined;
      }
      case "capitalize": {
        // str.capitalize: the rest lowered too (the library only raises the first character). Python titlecases the
        // first character, which differs from upper case for a few (ǆ, ß): those come out upper-cased here.
        if (operand.type !== "StringValue") return undefined;
        const [first = "", ...rest] = operand.value as string;
        return new StringValue(first.toUpperCase() + rest.join("").toLowerCase());
      }
      case "dictsort":
        return operand.type === "ObjectValue" ? dictsort(operand, arg(0, "case_sensitive"), arg(1, "by"), arg(2, "reverse")) : undefined;
      case "items":
        return itemsGenerator(operand);
      case "list":
        // list() makes a list of a tuple or a view too; the library hands each back as it is.
        return operand.type === "ArrayValue" || operand.type === "TupleValue" ? new ArrayValue(items(operand)) : undefined;
    }
    return undefined;
  }

  /** str.replace as the library does it, once what it would build fits the bound (`''` matches between every character). */
  private replace(target: Value, positional: Value[], keyword: Map<string, Value>): Value {
    const [old, by, count = keyword.get("count")] = positional;
    const s = target.value as string;
    if (old?.type === "StringValue" && by?.type === "StringValue") {
      const [from, to] = [old.value as string, by.value as string];
      const most = count?.type === "IntegerValue" && (count.value as number) >= 0 ? (count.value as number) : Infinity;
      let matches = 0;
      if (from === "") matches = Math.min(s.length + 1, most);
      // Counted, not guessed from the lengths (a rare `old` in a long message builds little): no allocation.
      else if (to.length > from.length) for (let at = s.indexOf(from); at >= 0 && matches < most; at = s.indexOf(from, at + from.length)) matches++;
      if (s.length + matches * (to.length - from.length) > this.charsLeft) throw new RenderBoundExceeded("characters");
    }
    return libraryMethod(target, "replace")(count === undefined ? positional : [old!, by!, count]);
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
      let piece: string;
      if (STATEMENTS.has(s.type)) {
        const r = libraryRender.call(this, [s], env);
        piece = typeof r === "string" ? r : String((r as Value).value);
      } else piece = pyStr(this.evaluate(s as never, env) as unknown as Value, this.charsLeft);
      // Every piece of output counts: a loop's text is built of its body's, each counted here.
      this.spend(piece.length);
      out += piece;
    }
    return BLOCK === "renderBlock" ? out : new StringValue(out);
  },
});

/**
 * jinja2's attribute getter (make_attrgetter) on each item: the path's parts by `.`, a part of digits an index (a
 * list's, a string's; a dict's keys are strings, so it finds none there); a part not found is Undefined (printed ""),
 * and a part read from Undefined raises UndefinedError.
 */
function attributes(xs: Value[], attribute: Value): Value[] {
  const path = String(attribute.value).split(".");
  return xs.map((x) => {
    let v: Value = x;
    for (const part of path) {
      if (v.type === "UndefinedValue") throw new TemplateRaised(`the attribute path ${pyStrRepr(path.join("."))} reads ${pyStrRepr(part)} of an undefined value`);
      const index = /^\d+$/.test(part) ? Number(part) : undefined;
      let next: Value | undefined;
      if (v.type === "ObjectValue") next = index === undefined ? (v.value as Map<string, Value>).get(part) : undefined;
      else if ((v.type === "ArrayValue" || v.type === "TupleValue") && index !== undefined) next = items(v)[index];
      else if (v.type === "StringValue" && index !== undefined && index < (v.value as string).length) next = new StringValue((v.value as string)[index]);
      v = next ?? new UndefinedValue();
    }
    return v;
  });
}

/**
 * Python's `==` (the library compares with JavaScript's `==`: containers by identity, and "1" == 1, "" == 0 or None ==
 * Undefined true): numbers and booleans by value (True == 1), strings by text, a list only to a list and a tuple only
 * to a tuple, item by item, a dict to a dict with the same keys and equal values, None only to None, Undefined only
 * to Undefined (jinja2's Undefined.__eq__). `step` is called per pair compared (the render's bound). Undefined
 * (hands the comparison to the library) for what this does not model: dict views, functions, generators, other types.
 */
function pyEquals(a: Value, b: Value, step: () => void): boolean | undefined {
  step();
  const kind = (v: Value) => {
    if (VIEWS.has(v) || GENERATORS.has(v)) return "other";
    switch (v.type) {
      case "IntegerValue":
      case "FloatValue":
      case "BooleanValue":
        return "number";
      case "ArrayValue":
        return TUPLES.has(v) ? "tuple" : "list";
      case "TupleValue":
        return "tuple";
      case "StringValue":
      case "NullValue":
      case "UndefinedValue":
      case "ObjectValue":
        return v.type;
      default:
        return "other";
    }
  };
  const [ka, kb] = [kind(a), kind(b)];
  if (ka === "other" || kb === "other") return a === b ? true : undefined;
  if (ka !== kb) return false;
  switch (ka) {
    case "number":
      return Number(a.value) === Number(b.value);
    case "StringValue":
      return a.value === b.value;
    case "NullValue":
    case "UndefinedValue":
      return true;
    case "ObjectValue": {
      const [x, y] = [a.value as Map<string, Value>, b.value as Map<string, Value>];
      if (x.size !== y.size) return false;
      for (const [k, v] of x) {
        const w = y.get(k);
        if (w === undefined) return false;
        const eq = pyEquals(v, w, step);
        if (eq !== true) return eq;
      }
      return true;
    }
    default: {
      const [x, y] = [items(a), items(b)];
      if (x.length !== y.length) return false;
      for (let i = 0; i < x.length; i++) {
        const eq = pyEquals(x[i]!, y[i]!, step);
        if (eq !== true) return eq;
      }
      return true;
    }
  }
}

/** The library's own method `name` of a value (its builtins, not exported), for the few this file wraps. */
function libraryMethod(v: Value, name: string): (args: Value[]) => Value {
  const method = (v as unknown as { builtins: Map<string, { value: (args: Value[]) => Value }> }).builtins.get(name)!;
  return (args) => method.value(args);
}

/** What a value built or read whole costs against the bound: a string's characters, a list's or dict's items. */
function sizeOf(v: Value): number {
  // A generator's pairs are built with it (one of a non-mapping has none, and raises when read).
  const pairs = GENERATORS.get(v);
  if (pairs !== undefined) return pairs;
  if (v.type === "StringValue") return (v.value as string).length;
  if (v.type === "ArrayValue" || v.type === "TupleValue") return items(v).length;
  if (v.type === "ObjectValue") return (v.value as Map<string, Value>).size;
  return 0;
}

// The (key, value) pairs of a dict (items(), `items`, dictsort), tuples in Python: printed `('a', 1)`. They stay the
// library's lists otherwise, so `{% for k, v in d.items() %}` unpacks them (the library unpacks lists only).
const TUPLES = new WeakSet<object>();

/** `list`'s pairs marked as tuples. */
function tuples(list: Value): Value {
  for (const pair of items(list)) TUPLES.add(pair);
  return list;
}

// A dict's keys(), values() and items(), views in Python: printed `dict_keys(['a'])`. The library gives lists.
const DICT_VIEWS = new Map([["keys", "dict_keys"], ["values", "dict_values"], ["items", "dict_items"]]);
const VIEWS = new WeakMap<object, string>();

function dictView(dict: Value, method: string): Value {
  const view = libraryMethod(dict, method)([]);
  VIEWS.set(view, DICT_VIEWS.get(method)!);
  return method === "items" ? tuples(view) : view;
}

// The `items` filter's result: a generator in jinja2 (do_items), held here as the library's list of its pairs. Only the
// ways to read a generator work on it (a loop, list, first, join, in, map, ...); it has no length, no JSON and no last
// item (TemplateRaised, jinja2's TypeError), it is true even when empty, and its str() holds a memory address, so a
// render printing one is no render of ours (a plain Error: ChatUnrenderable). Each maps to the number of its pairs.
const GENERATORS = new WeakMap<object, number>();

/** jinja2's `items` filter: a dict's pairs, none of Undefined; of anything else, a generator that raises when read. */
function itemsGenerator(v: Value): Value {
  const gen = v.type === "ObjectValue" ? tuples(libraryMethod(v, "items")([])) : new ArrayValue([]);
  GENERATORS.set(gen, items(gen).length);
  Object.assign(gen, { __bool__: () => new BooleanValue(true) });
  if (v.type !== "ObjectValue" && v.type !== "UndefinedValue") {
    Object.defineProperty(gen, "value", {
      get() {
        throw new TemplateRaised("Can only get item pairs from a mapping.");
      },
    });
  }
  return gen;
}

/** jinja2's dictsort(case_sensitive=False, by="key", reverse=False): the library sorts, its pairs become tuples. */
function dictsort(dict: Value, caseSensitive?: Value, by?: Value, reverse?: Value): Value {
  return tuples(libraryMethod(dict, "dictsort")([caseSensitive ?? new BooleanValue(false), by ?? new StringValue("key"), reverse ?? new BooleanValue(false)]));
}

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

function jsonOptions(limit: number, ensureAscii?: Value, indent?: Value, separators?: Value, sortKeys?: Value): JsonOptions {
  const set = (v?: Value) => v !== undefined && v.type !== "NullValue" && v.type !== "UndefinedValue";
  if (set(indent) && indent!.type !== "StringValue" && Number(indent!.value) > limit) throw new RenderBoundExceeded("characters");
  const ind = !set(indent) ? null : indent!.type === "StringValue" ? (indent!.value as string) : " ".repeat(Number(indent!.value));
  let itemSep = ind === null ? ", " : ",";
  let keySep = ": ";
  if (set(separators)) [itemSep, keySep] = items(separators!).map((x) => x.value as string) as [string, string];
  const truthy = (v?: Value) => set(v) && Boolean(v!.value);
  return { ensureAscii: truthy(ensureAscii), indent: ind, itemSep, keySep, sortKeys: truthy(sortKeys), limit };
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

/**
 * What one render may spend: node evaluations (`steps`) and characters or items built or read whole (`chars`),
 * each a base plus an allowance per character of its input (see renderBound). jinja2 has no such bound: a template
 * that passes it (a request's own, under --trust-request-chat-template: loops nested over range()) would render
 * there, slowly, so it is no fault of the request; here the render stops, and the chat is routed by load.
 */
export type RenderBound = { steps: number; chars: number };

// Measured on the shipped templates (Qwen3, Llama 3, Gemma 3, DeepSeek V3; test/render-bound.test.ts keeps each
// under half its bound): 200 messages with 8 tools need at most ~11k steps and ~420k characters; per character of
// input, at most 1.3 steps (Gemma 3) and 7.4 characters (Llama 3, Qwen3), both on thousands of empty messages, the
// shape that costs the most per character. So the allowances leave 7x and 4x, and the bases alone would cover 200
// messages ~9x and ~2.5x over. At the base the library takes ~0.1-0.5 s (2-core machine, loaded): what a hostile tiny
// input costs a member (a million steps took one to a few seconds).
const STEPS_BASE = 100_000;
const STEPS_PER_INPUT_CHAR = 10;
const CHARS_BASE = 1024 * 1024;
const CHARS_PER_INPUT_CHAR = 32;

/** The bound of a render whose template and variables (as JSON) are `inputChars` characters in all, `scale` times over. */
export function renderBound(inputChars: number, scale = 1): RenderBound {
  return { steps: scale * (STEPS_BASE + STEPS_PER_INPUT_CHAR * inputChars), chars: scale * (CHARS_BASE + CHARS_PER_INPUT_CHAR * inputChars) };
}

/** A render stopped at its bound (RenderBound): jinja2 would have gone on. */
export class RenderBoundExceeded extends Error {
  constructor(what: "evaluation steps" | "characters") {
    super(`chat template rendering stopped: it passed its bound on ${what}, set in proportion to the template's and the chat's size`);
  }
}

/** A render's cost, counted as it went (the tests measure the shipped templates with it). */
export type RenderCost = { steps: number; chars: number; inputChars: number };

/**
 * About the characters `v` takes as JSON (strings by their length, any other value a few), found by walking it
 * without building the text: a render's input size for its bound. JSON.stringify of a 160 KB chat was half of the
 * time a cached conversation's encode took (~1 ms of ~1.8).
 */
function jsonChars(v: unknown): number {
  if (typeof v === "string") return v.length + 2;
  if (v === null || typeof v !== "object" || v instanceof PyFloat || v instanceof PyInt) return 8;
  let n = 2;
  if (Array.isArray(v)) for (const x of v) n += jsonChars(x) + 1;
  else for (const [k, x] of Object.entries(v)) n += k.length + 4 + jsonChars(x);
  return n;
}

/** A parsed chat template rendered with Python semantics, each render within renderBound(its input, `boundScale`). */
export class PyTemplate {
  private readonly program: Template["parsed"];
  private readonly sourceChars: number;

  constructor(source: string, private readonly boundScale = 1) {
    // jinja2's lexer writes every newline of the template's text and string literals as its newline_sequence
    // ("\n"): a template with CRLF (a config's string, a file) renders as with LF.
    this.program = new Template(source.replace(/\r\n?/g, "\n")).parsed;
    this.sourceChars = source.length;
  }

  /** The template's syntax tree (read by the content-format detection). */
  get ast(): Template["parsed"] {
    return this.program;
  }

  render(vars: Record<string, unknown>, cost?: RenderCost): string {
    const inputChars = this.sourceChars + jsonChars(vars);
    const env = new Environment();
    // The globals transformers' environment has; jinja2's true/false/none literals resolve as variables here.
    for (const [k, v] of [["true", true], ["false", false], ["none", null], ["True", true], ["False", false], ["None", null]] as const) env.set(k, v);
    env.set("raise_exception", (message: unknown) => {
      throw new TemplateRaised(String(message));
    });
    env.set("range", range);
    env.set("strftime_now", strftimeNow);
    for (const [k, v] of Object.entries(vars)) env.setVariable(k, toTemplateValue(v) as never);
    const interpreter = new PythonInterpreter(env, renderBound(inputChars, this.boundScale));
    try {
      return (interpreter.run(this.program) as unknown as Value).value as string;
    } finally {
      if (cost !== undefined) Object.assign(cost, interpreter.cost, { inputChars });
    }
  }
}
