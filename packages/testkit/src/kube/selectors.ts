// Label and field selectors with the Kubernetes grammar: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
// `a notin (x)`, `a`, `!a`, comma-separated (AND). Field selectors use dotted paths
// (`metadata.name=x`, `status.phase!=Failed`) with the equality operators only.
import type { KubeObject } from "./resources.ts";

type Requirement =
  | { op: "eq" | "neq"; key: string; value: string }
  | { op: "in" | "notin"; key: string; values: string[] }
  | { op: "exists" | "notexists"; key: string };

export type Selector = (fields: (key: string) => string | undefined) => boolean;

export class SelectorError extends Error {}

function splitTerms(text: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (c === "," && depth === 0) {
      terms.push(text.slice(start, i));
      start = i + 1;
    }
  }
  terms.push(text.slice(start));
  return terms.map((t) => t.trim()).filter((t) => t.length > 0);
}

const KEY = String.raw`[A-Za-z0-9][-A-Za-z0-9_./]*`;
const SET_RE = new RegExp(String.raw`^(${KEY})\s+(in|notin)\s*\(([^)]*)\)$`);
const EQ_RE = new RegExp(String.raw`^(${KEY})\s*(==|=|!=)\s*(.*)$`);
const EXISTS_RE = new RegExp(String.raw`^(!?)\s*(${KEY})$`);

function parseTerm(term: string, allowSets: boolean): Requirement {
  const set = SET_RE.exec(term);
  if (set && allowSets) {
    const values = set[3]!.split(",").map((v) => v.trim()).filter((v) => v.length > 0);
    return { op: set[2] === "in" ? "in" : "notin", key: set[1]!, values };
  }
  const eq = EQ_RE.exec(term);
  if (eq) return { op: eq[2] === "!=" ? "neq" : "eq", key: eq[1]!, value: eq[3]!.trim() };
  const ex = EXISTS_RE.exec(term);
  if (ex && allowSets) return { op: ex[1] === "!" ? "notexists" : "exists", key: ex[2]! };
  throw new SelectorError(`unable to parse requirement: ${term}`);
}

function matches(r: Requirement, get: (key: string) => string | undefined): boolean {
  const v = get(r.key);
  switch (r.op) {
    case "eq":
      return v === r.value;
    case "neq":
      return v !== r.value;
    case "in":
      return v !== undefined && r.values.includes(v);
    case "notin":
      return v === undefined || !r.values.includes(v);
    case "exists":
      return v !== undefined;
    case "notexists":
      return v === undefined;
  }
}

function compile(text: string | null | undefined, allowSets: boolean): Selector {
  const reqs = text ? splitTerms(text).map((t) => parseTerm(t, allowSets)) : [];
  return (get) => reqs.every((r) => matches(r, get));
}

export function parseLabelSelector(text: string | null | undefined): (obj: KubeObject) => boolean {
  const sel = compile(text, true);
  return (obj) => sel((k) => obj.metadata?.labels?.[k]);
}

export function parseFieldSelector(text: string | null | undefined): (obj: KubeObject) => boolean {
  const sel = compile(text, false);
  return (obj) => sel((path) => fieldAt(obj, path));
}

function fieldAt(obj: KubeObject, path: string): string | undefined {
  let cur: unknown = obj;
  for (const part of path.split(".")) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string, unknown>)[part];
  }
  // Kubernetes compares an unset field as the empty string (`spec.nodeName=` selects unscheduled pods).
  if (cur === undefined || cur === null) return "";
  return typeof cur === "object" ? JSON.stringify(cur) : String(cur);
}
