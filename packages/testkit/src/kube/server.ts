// A fake Kubernetes API server on plain HTTP: list, watch (resourceVersion, bookmarks, 410 after
// compaction), get/create/update/patch/delete (with status subresource, finalizers and
// ownerReference garbage collection) for any resource type, plus the discovery documents.
// It is a real HTTP server so that @kubernetes/client-node (and kubectl) are exercised for real.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KubeConfig } from "@kubernetes/client-node";
import { hostPort } from "@kv-epp/protocol";
import YAML from "yaml";
import { json, parseResourcePath, statusBody, successStatus, verbOf, type ResourcePath, type Verb } from "./http.ts";
import { jsonPatch, mergePatch, PatchError } from "./patch.ts";
import { apiVersionOf, ResourceTable, type KubeObject, type ResourceType } from "./resources.ts";
import { parseFieldSelector, parseLabelSelector, SelectorError } from "./selectors.ts";
import { ApiError, ObjectStore, type WatchEventType } from "./store.ts";

export type RequestRecord = ResourcePath & { verb: Verb; method: string; status: number; user: string };

/** The user of the default kubeconfig: the harness itself, which RBAC authorizers treat as an admin. */
export const ADMIN_USER = "fake-token";

export type FakeKubeApiOptions = {
  host?: string; // default 127.0.0.1
  port?: number; // default 0 (ephemeral)
  namespace?: string; // the kubeconfig context's namespace, default "default"
  bookmarkIntervalMs?: number; // for watches with allowWatchBookmarks=true, default 1000
  /**
   * Return false to answer 403 (e.g. to hold a client to the RBAC rules in deploy/). `user` is the
   * client's bearer token: `ADMIN_USER` for the default kubeconfig, the user named to `kubeconfigFor`.
   */
  authorize?: (req: ResourcePath & { verb: Verb; user: string }) => boolean;
};

export type FakeKubeApi = {
  readonly url: string;
  readonly kubeConfig: KubeConfig;
  /** A kubeconfig file written at start (point KUBECONFIG at it for child processes); close() removes it. */
  readonly kubeconfigPath: string;
  writeKubeconfig(path: string): void;
  /**
   * A kubeconfig file (written once per user) whose bearer token is `user`, e.g.
   * `system:serviceaccount:<ns>:<name>`, so that `authorize` can tell clients apart.
   */
  kubeconfigFor(user: string): string;
  /** Creates or replaces an object (no resourceVersion check); returns it as stored. */
  upsert(obj: KubeObject): KubeObject;
  /** Deletes at once (finalizers ignored); `kind` is a kind or a plural ("Pod" / "pods"). */
  remove(kind: string, namespace: string | undefined, name: string): KubeObject | undefined;
  get(kind: string, namespace: string | undefined, name: string): KubeObject | undefined;
  list(kind: string, namespace?: string): KubeObject[];
  /** Forgets the event log: a watch resuming from an older resourceVersion now gets 410 Gone. */
  compact(): void;
  /** Ends every open watch stream, as an API server restart would. */
  dropWatches(): void;
  /** Every request served so far, in order. */
  readonly requests: readonly RequestRecord[];
  readonly resourceVersion: number;
  close(): Promise<void>;
};

type OpenWatch = { close: () => void };
type Streamed = (res: ServerResponse) => void;

function buildKubeConfig(url: string, namespace: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "fake", server: url, skipTLSVerify: true }],
    users: [{ name: "fake", token: ADMIN_USER }],
    contexts: [{ name: "fake", cluster: "fake", user: "fake", namespace }],
    currentContext: "fake",
  });
  return kc;
}

function kubeconfigYaml(url: string, namespace: string, token = ADMIN_USER): string {
  return YAML.stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "fake", cluster: { server: url, "insecure-skip-tls-verify": true } }],
    users: [{ name: "fake", user: { token } }],
    contexts: [{ name: "fake", context: { cluster: "fake", user: "fake", namespace } }],
    "current-context": "fake",
  });
}

async function readBody(req: Request): Promise<unknown> {
  const text = await req.text();
  if (text.length === 0) return {};
  const type = req.headers.get("content-type") ?? "";
  try {
    return type.includes("yaml") ? YAML.parse(text) : JSON.parse(text);
  } catch (e) {
    throw new ApiError(400, "BadRequest", `cannot decode body: ${(e as Error).message}`);
  }
}

function asObject(body: unknown): KubeObject {
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new ApiError(400, "BadRequest", "body must be an object");
  return body as KubeObject;
}

export async function startFakeKubeApi(opts: FakeKubeApiOptions = {}): Promise<FakeKubeApi> {
  const host = opts.host ?? "127.0.0.1";
  const namespace = opts.namespace ?? "default";
  const bookmarkMs = opts.bookmarkIntervalMs ?? 1000;
  const table = new ResourceTable();
  const store = new ObjectStore();
  const watches = new Set<OpenWatch>();
  const requests: RequestRecord[] = [];

  function discovery(pathname: string): Response | null {
    if (pathname === "/version") return json({ major: "1", minor: "32", gitVersion: "v1.32.0-kv-epp-fake", platform: "linux/amd64" });
    if (pathname === "/api") return json({ kind: "APIVersions", versions: ["v1"], serverAddressByClientCIDRs: [] });
    if (pathname === "/apis") {
      const groups = new Map<string, string>();
      for (const r of table.all()) if (r.group !== "") groups.set(r.group, r.version);
      return json({
        kind: "APIGroupList",
        apiVersion: "v1",
        groups: [...groups].map(([name, version]) => {
          const gv = { groupVersion: `${name}/${version}`, version };
          return { name, versions: [gv], preferredVersion: gv };
        }),
      });
    }
    const m = /^\/(?:api\/(v1)|apis\/([^/]+)\/([^/]+))\/?$/.exec(pathname);
    if (!m) return null;
    const group = m[2] ?? "";
    const version = m[1] ?? m[3]!;
    const resources = table
      .all()
      .filter((r) => r.group === group && r.version === version)
      .flatMap((r) => [
        { name: r.plural, singularName: r.kind.toLowerCase(), namespaced: r.namespaced, kind: r.kind, verbs: ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"] },
        { name: `${r.plural}/status`, singularName: "", namespaced: r.namespaced, kind: r.kind, verbs: ["get", "patch", "update"] },
      ]);
    return json({ kind: "APIResourceList", apiVersion: "v1", groupVersion: group ? `${group}/${version}` : version, resources });
  }

  // A watch is served on the raw node:http response: Bun.serve holds back the headers of a streamed
  // body until its first chunk, and a client waiting for headers on a quiet watch would hang.
  function serveWatch(r: ResourceType, ns: string | undefined, q: URLSearchParams): Streamed {
    const label = parseLabelSelector(q.get("labelSelector"));
    const field = parseFieldSelector(q.get("fieldSelector"));
    return (res) => {
      res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
      res.flushHeaders();
      const write = (type: string, object: KubeObject) => {
        if (!res.writableEnded) res.write(`${JSON.stringify({ type, object })}\n`);
      };
      let unsubscribe: (() => void) | undefined;
      const timers: ReturnType<typeof setTimeout>[] = [];
      const handle: OpenWatch = {
        close() {
          if (!watches.delete(handle)) return;
          unsubscribe?.();
          for (const t of timers) clearTimeout(t);
          if (!res.writableEnded) res.end();
        },
      };
      watches.add(handle);
      res.on("close", () => handle.close());
      const result = store.watch(
        { res: r, namespace: ns, match: (o) => label(o) && field(o), send: (t: WatchEventType, o) => write(t, o) },
        q.get("resourceVersion") ?? undefined,
      );
      if (result === "gone") {
        // What a real API server does: 200, one ERROR event carrying a 410 Status, end of stream.
        write("ERROR", statusBody(new ApiError(410, "Expired", `too old resource version: ${q.get("resourceVersion")} (${store.currentRv()})`)));
        handle.close();
        return;
      }
      unsubscribe = result;
      if (q.get("allowWatchBookmarks") === "true") {
        const tick = () => {
          write("BOOKMARK", { kind: r.kind, apiVersion: apiVersionOf(r), metadata: { resourceVersion: String(store.currentRv()) } });
          timers[0] = setTimeout(tick, bookmarkMs);
        };
        timers[0] = setTimeout(tick, bookmarkMs);
      }
      const timeoutSeconds = Number(q.get("timeoutSeconds") ?? "0");
      if (timeoutSeconds > 0) timers[1] = setTimeout(() => handle.close(), timeoutSeconds * 1000);
    };
  }

  function listBody(r: ResourceType, items: KubeObject[]): KubeObject {
    return { kind: `${r.kind}List`, apiVersion: apiVersionOf(r), metadata: { resourceVersion: String(store.currentRv()) }, items };
  }

  function patched(r: ResourceType, p: ResourcePath, type: string, body: unknown): KubeObject {
    const current = store.get(r, p.namespace, p.name!);
    if (!current) {
      // Server-side apply creates what does not exist yet.
      if (type.includes("apply-patch")) return store.create(r, { ...asObject(body), metadata: { ...asObject(body).metadata, namespace: p.namespace } });
      throw new ApiError(404, "NotFound", `${r.plural} "${p.name}" not found`, { name: p.name, kind: r.plural });
    }
    let next: KubeObject;
    try {
      next = asObject(type.includes("json-patch") ? jsonPatch(current, body) : mergePatch(current, body));
    } catch (e) {
      if (e instanceof PatchError) throw new ApiError(422, "Invalid", e.message);
      throw e;
    }
    if (p.subresource === "status") return store.update(r, { ...current, status: next.status }, { statusOnly: true });
    // A patch applies to the version read just above: drop the client's resourceVersion unless it set one on purpose.
    const sent = (body as KubeObject).metadata?.resourceVersion;
    next.metadata = { ...next.metadata, resourceVersion: typeof sent === "string" ? sent : undefined };
    return store.update(r, next);
  }

  async function serveResource(p: ResourcePath, verb: Verb, req: Request, q: URLSearchParams): Promise<Response | Streamed> {
    const body = verb === "create" || verb === "update" || verb === "patch" ? await readBody(req) : undefined;
    const kindHint = (body as KubeObject | undefined)?.kind;
    const r = table.fromPath(p.group, p.version, p.plural, typeof kindHint === "string" ? kindHint : undefined);
    const ns = r.namespaced ? p.namespace : undefined;
    switch (verb) {
      case "get": {
        const o = store.get(r, ns, p.name!);
        if (!o) throw new ApiError(404, "NotFound", `${r.plural} "${p.name}" not found`, { name: p.name, kind: r.plural, group: r.group });
        return json(o);
      }
      case "list": {
        const label = parseLabelSelector(q.get("labelSelector"));
        const field = parseFieldSelector(q.get("fieldSelector"));
        return json(listBody(r, store.list(r, ns, (o) => label(o) && field(o))));
      }
      case "watch":
        return serveWatch(r, ns, q);
      case "create": {
        const obj = asObject(body);
        const created = store.create(r, { ...obj, metadata: { ...obj.metadata, ...(ns !== undefined ? { namespace: ns } : {}) } });
        return json(created, 201);
      }
      case "update": {
        const obj = asObject(body);
        const meta = { ...obj.metadata, name: p.name, ...(ns !== undefined ? { namespace: ns } : {}) };
        return json(store.update(r, { ...obj, metadata: meta }, { statusOnly: p.subresource === "status" }));
      }
      case "patch":
        return json(patched(r, p, req.headers.get("content-type") ?? "", body));
      case "delete":
        return json(store.delete(r, ns, p.name!));
      case "deletecollection": {
        const label = parseLabelSelector(q.get("labelSelector"));
        for (const o of store.list(r, ns, label)) store.delete(r, o.metadata?.namespace, o.metadata?.name ?? "");
        return json(successStatus("", r.plural));
      }
    }
  }

  async function handle(req: Request): Promise<Response | Streamed> {
    const url = new URL(req.url);
    const found = discovery(url.pathname);
    if (found) return found;
    const p = parseResourcePath(url.pathname);
    if (!p) return json(statusBody(new ApiError(404, "NotFound", `the server could not find the requested resource (${url.pathname})`)), 404);
    const q = url.searchParams;
    const isWatch = q.get("watch") === "true" || q.get("watch") === "1";
    let verb: Verb = "get";
    let status = 200;
    const user = /^Bearer (.+)$/.exec(req.headers.get("authorization") ?? "")?.[1] ?? "system:anonymous";
    try {
      verb = verbOf(req.method, p, isWatch);
      if (opts.authorize && !opts.authorize({ ...p, verb, user })) {
        throw new ApiError(403, "Forbidden", `${verb} ${p.plural} is forbidden for ${user}`);
      }
      const res = await serveResource(p, verb, req, q);
      status = res instanceof Response ? res.status : 200;
      return res;
    } catch (e) {
      const err =
        e instanceof ApiError ? e : e instanceof SelectorError ? new ApiError(400, "BadRequest", e.message) : new ApiError(500, "InternalError", String(e));
      status = err.code;
      return json(statusBody(err), err.code);
    } finally {
      requests.push({ ...p, verb, method: req.method, status, user });
    }
  }

  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = chunks.length > 0 && req.method !== "GET" && req.method !== "HEAD" ? Buffer.concat(chunks) : undefined;
      const headers = new Headers();
      for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers.set(k, v);
      void handle(new Request(`http://fake${req.url ?? "/"}`, { method: req.method, headers, body })).then(async (out) => {
        if (!(out instanceof Response)) return out(res);
        res.writeHead(out.status, { "content-type": out.headers.get("content-type") ?? "application/json" });
        res.end(Buffer.from(await out.arrayBuffer()));
      });
    });
  });
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const url = `http://${hostPort(host, port)}`;
  const writeKubeconfig = (path: string) => writeFileSync(path, kubeconfigYaml(url, namespace));
  const kubeconfigDir = mkdtempSync(join(tmpdir(), "kv-epp-fake-kube-"));
  const kubeconfigPath = join(kubeconfigDir, "kubeconfig");
  writeKubeconfig(kubeconfigPath);
  const perUser = new Map<string, string>();
  const kubeconfigFor = (user: string) => {
    let path = perUser.get(user);
    if (!path) {
      path = join(kubeconfigDir, `kubeconfig-${perUser.size + 1}`);
      writeFileSync(path, kubeconfigYaml(url, namespace, user));
      perUser.set(user, path);
    }
    return path;
  };

  const api: FakeKubeApi = {
    url,
    kubeConfig: buildKubeConfig(url, namespace),
    kubeconfigPath,
    writeKubeconfig,
    kubeconfigFor,
    upsert(obj) {
      const r = table.fromKind(obj.kind ?? "", obj.apiVersion);
      const input = structuredClone(obj);
      if (input.metadata) delete input.metadata.resourceVersion;
      const exists = store.get(r, input.metadata?.namespace, input.metadata?.name ?? "");
      return exists ? store.update(r, input) : store.create(r, input);
    },
    remove(kind, ns, name) {
      const r = table.fromKind(kind);
      return store.get(r, ns, name) ? store.delete(r, ns, name, { force: true }) : undefined;
    },
    get: (kind, ns, name) => store.get(table.fromKind(kind), ns, name),
    list: (kind, ns) => store.list(table.fromKind(kind), ns),
    compact: () => store.compact(),
    dropWatches() {
      for (const w of [...watches]) w.close();
    },
    requests,
    get resourceVersion() {
      return store.currentRv();
    },
    async close() {
      api.dropWatches();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
      rmSync(kubeconfigDir, { recursive: true, force: true });
    },
  };
  return api;
}
