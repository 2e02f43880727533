import { expect, test } from "bun:test";
import { parseFieldSelector, parseLabelSelector, type KubeObject } from "../src/index.ts";

const obj = (labels: Record<string, string>, extra: Partial<KubeObject> = {}): KubeObject => ({ metadata: { name: "n", labels }, ...extra });

test("label selectors follow the Kubernetes grammar", () => {
  const o = obj({ app: "w", tier: "gold", "kubernetes.io/service-name": "peer" });
  const yes = ["", "app=w", "app==w", "app!=x", "tier in (gold, silver)", "zone notin (a)", "app", "!zone", "app=w,tier in (gold),!zone", "kubernetes.io/service-name=peer"];
  const no = ["app=x", "app!=w", "tier in (silver)", "tier notin (gold)", "zone", "!app", "app=w,zone"];
  for (const s of yes) expect([s, parseLabelSelector(s)(o)]).toEqual([s, true]);
  for (const s of no) expect([s, parseLabelSelector(s)(o)]).toEqual([s, false]);
  expect(() => parseLabelSelector("app in in")).toThrow(/unable to parse/);
});

test("field selectors compare dotted paths, an unset field reading as empty", () => {
  const o = obj({}, { status: { phase: "Running" }, spec: {} });
  expect(parseFieldSelector("status.phase=Running,metadata.name=n")(o)).toBe(true);
  expect(parseFieldSelector("status.phase!=Running")(o)).toBe(false);
  expect(parseFieldSelector("spec.nodeName=")(o)).toBe(true);
  expect(() => parseFieldSelector("status.phase in (Running)")).toThrow();
});
