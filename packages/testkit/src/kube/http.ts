// URL grammar and response bodies of the Kubernetes REST API, as far as the fake server serves it.
import { ApiError } from "./store.ts";
import type { KubeObject } from "./resources.ts";

export type Verb = "get" | "list" | "watch" | "create" | "update" | "patch" | "delete" | "deletecollection";

export type ResourcePath = {
  group: string;
  version: string;
  plural: string;
  namespace?: string;
  name?: string;
  subresource?: string;
};

/** `/api/v1/...` or `/apis/{group}/{version}/...`, optionally `namespaces/{ns}/` before the plural. */
export function parseResourcePath(pathname: string): ResourcePath | null {
  const segs = pathname.split("/").filter((s) => s.length > 0).map(decodeURIComponent);
  let group: string;
  let version: string;
  let rest: string[];
  if (segs[0] === "api" && segs.length >= 3) {
    group = "";
    version = segs[1]!;
    rest = segs.slice(2);
  } else if (segs[0] === "apis" && segs.length >= 4) {
    group = segs[1]!;
    version = segs[2]!;
    rest = segs.slice(3);
  } else {
    return null;
  }
  if (rest[0] === "namespaces" && rest.length >= 3) {
    return { group, version, namespace: rest[1], plural: rest[2]!, name: rest[3], subresource: rest[4] };
  }
  return { group, version, plural: rest[0]!, name: rest[1], subresource: rest[2] };
}

export function verbOf(method: string, p: ResourcePath, watch: boolean): Verb {
  switch (method) {
    case "GET":
      return p.name ? "get" : watch ? "watch" : "list";
    case "POST":
      return "create";
    case "PUT":
      return "update";
    case "PATCH":
      return "patch";
    case "DELETE":
      return p.name ? "delete" : "deletecollection";
    default:
      throw new ApiError(405, "MethodNotAllowed", `method ${method} not allowed`);
  }
}

export function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

export function statusBody(err: ApiError): KubeObject {
  return {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message: err.message,
    reason: err.reason,
    ...(err.details ? { details: err.details } : {}),
    code: err.code,
  };
}

export function successStatus(name: string, kind: string): KubeObject {
  return { kind: "Status", apiVersion: "v1", metadata: {}, status: "Success", details: { name, kind } };
}
