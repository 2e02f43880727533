// Renders the kustomizations in deploy/ without kubectl, for machines that lack it. It covers what
// those kustomizations use, nothing more: `resources` (files and directories, recursively),
// `namespace`, `patches` (strategic merge by kind/name, with the merge keys of the pod template
// lists and `$patch: delete`) and `configMapGenerator` from files, without the name's hash suffix
// (`options.disableNameSuffixHash: true`, which it requires: it does not compute kustomize's hash). Where kubectl exists, a test checks that both renderings agree.
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import YAML from "yaml";
import type { KubeObject } from "./kube/resources.ts";
import { ADMIN_USER } from "./kube/server.ts";

type ConfigMapGenerator = { name: string; files?: string[]; options?: { disableNameSuffixHash?: boolean; labels?: Record<string, string> } };
type Kustomization = {
  namespace?: string;
  resources?: string[];
  patches?: ({ path: string } | { patch: string })[];
  configMapGenerator?: ConfigMapGenerator[];
  [key: string]: unknown;
};

const SUPPORTED = new Set(["apiVersion", "kind", "namespace", "resources", "patches", "configMapGenerator"]);
const CLUSTER_SCOPED = new Set(["Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume", "StorageClass"]);

// Strategic-merge keys of the lists a pod template holds (from the Kubernetes API types).
const MERGE_KEYS: Record<string, string> = {
  containers: "name",
  initContainers: "name",
  env: "name",
  volumes: "name",
  volumeMounts: "mountPath",
  ports: "containerPort",
  imagePullSecrets: "name",
};

function kustomizationFile(dir: string): string {
  for (const name of ["kustomization.yaml", "kustomization.yml", "Kustomization"]) {
    const p = join(dir, name);
    if (existsSync(p)) return p;
  }
  throw new Error(`no kustomization in ${dir}`);
}

function readDocs(path: string): KubeObject[] {
  return YAML.parseAllDocuments(readFileSync(path, "utf8"))
    .map((d) => d.toJS() as KubeObject | null)
    .filter((o): o is KubeObject => o !== null && typeof o === "object");
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

function mergeList(base: unknown[], patch: unknown[], key: string | undefined): unknown[] {
  if (!key) return structuredClone(patch);
  const out = structuredClone(base);
  const added: unknown[] = [];
  for (const item of patch) {
    const k = isObject(item) ? item[key] : undefined;
    const i = out.findIndex((b) => isObject(b) && k !== undefined && b[key] === k);
    if (isObject(item) && item.$patch === "delete") {
      if (i >= 0) out.splice(i, 1);
    } else if (i >= 0) out[i] = strategicMerge(out[i], item);
    else added.push(structuredClone(item));
  }
  // kustomize (kyaml) puts items the patch adds before the existing ones.
  return [...added, ...out];
}

function strategicMerge(base: unknown, patch: unknown): unknown {
  if (!isObject(patch) || !isObject(base)) return structuredClone(patch);
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(patch)) {
    if (k === "$patch") continue;
    if (v === null) delete out[k];
    else if (Array.isArray(v) && Array.isArray(out[k])) out[k] = mergeList(out[k] as unknown[], v, MERGE_KEYS[k]);
    else out[k] = strategicMerge(out[k], v);
  }
  return out;
}

const sameTarget = (a: KubeObject, b: KubeObject) => a.kind === b.kind && a.metadata?.name === b.metadata?.name;

function applyNamespace(o: KubeObject, ns: string): KubeObject {
  const out = structuredClone(o);
  out.metadata ??= {};
  if (out.kind === "Namespace") out.metadata.name = ns;
  else if (!CLUSTER_SCOPED.has(out.kind ?? "")) out.metadata.namespace = ns;
  if (out.kind === "RoleBinding" || out.kind === "ClusterRoleBinding") {
    for (const s of (out.subjects as { kind: string; namespace?: string }[] | undefined) ?? []) {
      if (s.kind === "ServiceAccount" && !s.namespace) s.namespace = ns;
    }
  }
  return out;
}

/** Renders the kustomization in `dir` into its list of objects. */
export function renderKustomization(dir: string): KubeObject[] {
  const file = kustomizationFile(dir);
  const k = YAML.parse(readFileSync(file, "utf8")) as Kustomization;
  const unsupported = Object.keys(k).filter((key) => !SUPPORTED.has(key));
  if (unsupported.length > 0) throw new Error(`${file}: fields this renderer does not emulate: ${unsupported.join(", ")}`);
  let objects: KubeObject[] = [];
  for (const r of k.resources ?? []) {
    const p = resolve(dirname(file), r);
    objects.push(...(statSync(p).isDirectory() ? renderKustomization(p) : readDocs(p)));
  }
  for (const g of k.configMapGenerator ?? []) objects.push(generatedConfigMap(file, g));
  for (const entry of k.patches ?? []) {
    const patches = "path" in entry ? readDocs(resolve(dirname(file), entry.path)) : YAML.parseAllDocuments(entry.patch).map((d) => d.toJS() as KubeObject);
    for (const patch of patches) {
      const i = objects.findIndex((o) => sameTarget(o, patch));
      if (i < 0) throw new Error(`${file}: patch target ${patch.kind}/${patch.metadata?.name} not found`);
      if (patch.$patch === "delete") objects.splice(i, 1);
      else objects[i] = strategicMerge(objects[i], patch) as KubeObject;
    }
  }
  if (k.namespace) objects = objects.map((o) => applyNamespace(o, k.namespace!));
  return objects;
}

/** A ConfigMap from `files` entries (`key=path` or `path`, whose base name is the key). */
function generatedConfigMap(file: string, g: ConfigMapGenerator): KubeObject {
  if (g.options?.disableNameSuffixHash !== true)
    throw new Error(`${file}: configMapGenerator ${g.name}: only options.disableNameSuffixHash: true is emulated (no hash suffix)`);
  const data: Record<string, string> = {};
  for (const f of g.files ?? []) {
    const [key, path] = f.includes("=") ? (f.split("=", 2) as [string, string]) : [f.slice(f.lastIndexOf("/") + 1), f];
    data[key] = readFileSync(resolve(dirname(file), path), "utf8");
  }
  return { apiVersion: "v1", kind: "ConfigMap", metadata: { name: g.name, ...(g.options.labels ? { labels: g.options.labels } : {}) }, data } as KubeObject;
}

/** Renders with `kubectl kustomize` when kubectl is on PATH; null otherwise. */
export function renderWithKubectl(dir: string): KubeObject[] | null {
  const kubectl = Bun.which("kubectl");
  if (!kubectl) return null;
  const r = Bun.spawnSync([kubectl, "kustomize", dir], { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`kubectl kustomize ${dir} failed: ${r.stderr.toString()}`);
  return YAML.parseAllDocuments(r.stdout.toString())
    .map((d) => d.toJS() as KubeObject | null)
    .filter((o): o is KubeObject => o !== null);
}

type PolicyRule = { apiGroups?: string[]; resources?: string[]; verbs?: string[]; resourceNames?: string[] };
type AuthzRequest = { group: string; plural: string; subresource?: string; name?: string; namespace?: string; verb: string };

/**
 * An `authorize` hook for the fake API server that grants exactly what the given Roles' rules
 * grant, so a process-level test fails when a component needs more than deploy/ gives it.
 */
export function rbacAuthorizer(roles: KubeObject[]): (req: AuthzRequest) => boolean {
  const rules = roles.flatMap((r) => (r.rules as PolicyRule[] | undefined) ?? []);
  const has = (list: string[] | undefined, v: string) => list?.includes("*") || list?.includes(v) === true;
  return (req) => {
    const resource = req.subresource ? `${req.plural}/${req.subresource}` : req.plural;
    return rules.some(
      (rule) =>
        has(rule.apiGroups, req.group) &&
        has(rule.resources, resource) &&
        has(rule.verbs, req.verb) &&
        (!rule.resourceNames?.length || (req.name !== undefined && rule.resourceNames.includes(req.name))),
    );
  };
}

type Binding = KubeObject & { roleRef?: { kind: string; name: string }; subjects?: { kind: string; name: string; namespace?: string }[] };

/**
 * RBAC per identity, from rendered manifests: a request by `system:serviceaccount:<ns>:<name>`
 * (the user `SimCluster` gives a pod with that service account) is allowed what the Roles bound to
 * it by RoleBindings in `<ns>` allow, in that namespace only. `admins` (default: the harness's own
 * kubeconfig user) may do anything; anyone else nothing.
 */
export function rbacAuthorizerFor(objects: KubeObject[], admins: string[] = [ADMIN_USER]): (req: AuthzRequest & { user: string }) => boolean {
  const perUser = new Map<string, ((req: AuthzRequest) => boolean) | null>();
  const forUser = (user: string) => {
    if (perUser.has(user)) return perUser.get(user)!;
    const m = /^system:serviceaccount:([^:]+):([^:]+)$/.exec(user);
    let check: ((req: AuthzRequest) => boolean) | null = null;
    if (m) {
      const [, ns, sa] = m as unknown as [string, string, string];
      const roleNames = objects
        .filter((o): o is Binding => o.kind === "RoleBinding" && o.metadata?.namespace === ns)
        .filter((b) => b.subjects?.some((s) => s.kind === "ServiceAccount" && s.name === sa && (s.namespace ?? ns) === ns))
        .map((b) => b.roleRef?.name);
      const allowed = rbacAuthorizer(objects.filter((o) => o.kind === "Role" && o.metadata?.namespace === ns && roleNames.includes(o.metadata?.name)));
      check = (req) => req.namespace === ns && allowed(req);
    }
    perUser.set(user, check);
    return check;
  };
  return (req) => admins.includes(req.user) || (forUser(req.user)?.(req) ?? false);
}
