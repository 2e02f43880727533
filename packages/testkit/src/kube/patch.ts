// PATCH bodies: JSON Patch (RFC 6902), JSON Merge Patch (RFC 7386). Strategic merge and apply
// patches are treated as merge patches: good enough for the label/annotation/status updates that
// tests make, and the difference (list merge keys) is documented in the README.

export class PatchError extends Error {}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

export function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== "object" || Array.isArray(patch)) return structuredClone(patch);
  const out: Record<string, unknown> =
    target !== null && typeof target === "object" && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch as Record<string, unknown>)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

type Op = { op: string; path: string; value?: Json; from?: string };

function pointer(path: string): string[] {
  if (path === "") return [];
  if (!path.startsWith("/")) throw new PatchError(`bad JSON pointer ${path}`);
  return path
    .slice(1)
    .split("/")
    .map((p) => p.replaceAll("~1", "/").replaceAll("~0", "~"));
}

function parentOf(doc: unknown, parts: string[]): { parent: Record<string, unknown> | unknown[]; key: string } {
  let cur: unknown = doc;
  for (const p of parts.slice(0, -1)) {
    if (cur === null || typeof cur !== "object") throw new PatchError(`path not found at ${p}`);
    cur = Array.isArray(cur) ? cur[Number(p)] : (cur as Record<string, unknown>)[p];
  }
  if (cur === null || typeof cur !== "object") throw new PatchError("path not found");
  return { parent: cur as Record<string, unknown> | unknown[], key: parts[parts.length - 1]! };
}

function read(doc: unknown, path: string): unknown {
  const parts = pointer(path);
  if (parts.length === 0) return doc;
  const { parent, key } = parentOf(doc, parts);
  const v = Array.isArray(parent) ? parent[Number(key)] : parent[key];
  if (v === undefined) throw new PatchError(`path ${path} not found`);
  return v;
}

function remove(doc: unknown, path: string): void {
  const { parent, key } = parentOf(doc, pointer(path));
  if (Array.isArray(parent)) {
    const i = Number(key);
    if (!(i >= 0 && i < parent.length)) throw new PatchError(`path ${path} not found`);
    parent.splice(i, 1);
  } else {
    if (!(key in parent)) throw new PatchError(`path ${path} not found`);
    delete parent[key];
  }
}

function add(doc: unknown, path: string, value: unknown, replace: boolean): unknown {
  const parts = pointer(path);
  if (parts.length === 0) return structuredClone(value);
  const { parent, key } = parentOf(doc, parts);
  if (Array.isArray(parent)) {
    const i = key === "-" ? parent.length : Number(key);
    if (replace) parent[i] = structuredClone(value);
    else parent.splice(i, 0, structuredClone(value));
  } else {
    if (replace && !(key in parent)) throw new PatchError(`path ${path} not found`);
    parent[key] = structuredClone(value);
  }
  return doc;
}

export function jsonPatch(target: unknown, ops: unknown): unknown {
  if (!Array.isArray(ops)) throw new PatchError("JSON patch must be an array");
  let doc = structuredClone(target);
  for (const o of ops as Op[]) {
    switch (o.op) {
      case "add":
        doc = add(doc, o.path, o.value, false);
        break;
      case "replace":
        doc = add(doc, o.path, o.value, true);
        break;
      case "remove":
        remove(doc, o.path);
        break;
      case "copy":
        doc = add(doc, o.path, read(doc, o.from ?? ""), false);
        break;
      case "move": {
        const v = read(doc, o.from ?? "");
        remove(doc, o.from ?? "");
        doc = add(doc, o.path, v, false);
        break;
      }
      case "test":
        if (JSON.stringify(read(doc, o.path)) !== JSON.stringify(o.value)) throw new PatchError(`test failed at ${o.path}`);
        break;
      default:
        throw new PatchError(`unknown op ${o.op}`);
    }
  }
  return doc;
}
