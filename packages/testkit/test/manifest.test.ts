import { expect, test } from "bun:test";
import { podSpecFromTemplate, simServiceFromManifest, type PodTemplate, LOOPBACK } from "../src/index.ts";

const template: PodTemplate = {
  metadata: { labels: { app: "w" } },
  spec: {
    serviceAccountName: "worker-sa",
    terminationGracePeriodSeconds: 10,
    containers: [
      {
        name: "main",
        image: "img:dev",
        command: ["serve", "--mode=fast"],
        args: ["--listen=0.0.0.0", "--events", "tcp://*:5557", "--bind", "0.0.0.0", "--name=$(POD_NAME)-$(SUFFIX)", "--keep=10.0.0.0"],
        env: [
          { name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
          { name: "POD_IP", valueFrom: { fieldRef: { fieldPath: "status.podIP" } } },
          { name: "SA", valueFrom: { fieldRef: { fieldPath: "spec.serviceAccountName" } } },
          { name: "SUFFIX", value: "x" },
          { name: "COMBINED", value: "$(POD_NAME)@$(POD_IP)" },
        ],
        ports: [{ name: "http", containerPort: 8000 }, { name: "kv", containerPort: 5557 }],
        readinessProbe: { httpGet: { path: "/ready", port: "http" } },
        lifecycle: { preStop: { exec: { command: ["sleep", "3"] } } },
      },
    ],
  },
};
const pod = { name: "w-1", namespace: "ns", ip: `${LOOPBACK}.5.9`, uid: "u-1" };

test("a pod template runs as its container says: entry point, args with the pod's own address, downward-API env, probe, preStop, grace", () => {
  const spec = podSpecFromTemplate(template, { entrypoints: { serve: ["/bin/bun", "serve.ts"] }, cwd: "/app", env: (p) => ({ LISTEN: p.ip }) })("w-1");
  expect(spec.command(pod)).toEqual({
    cmd: "/bin/bun",
    args: ["serve.ts", "--mode=fast", `--listen=${LOOPBACK}.5.9`, "--events", `tcp://${LOOPBACK}.5.9:5557`, "--bind", `${LOOPBACK}.5.9`, "--name=w-1-x", "--keep=10.0.0.0"],
    env: { POD_NAME: "w-1", POD_IP: `${LOOPBACK}.5.9`, SA: "worker-sa", SUFFIX: "x", COMBINED: `w-1@${LOOPBACK}.5.9`, LISTEN: `${LOOPBACK}.5.9` },
    cwd: "/app",
  });
  expect(spec.readiness).toEqual({ http: { port: 8000, path: "/ready" } });
  expect(spec.ports).toEqual([{ name: "http", containerPort: 8000 }, { name: "kv", containerPort: 5557 }]);
  expect(spec.preStopMs).toBe(3000);
  expect(spec.serviceAccountName).toBe("worker-sa"); // its API client acts as this account
  expect(spec.terminationGraceMs).toBe(7000); // the grace period includes the preStop hook
});

test("the image name is the entry point when the container has no command; extra fields are merged per pod", () => {
  const t = structuredClone(template);
  delete t.spec.containers[0]!.command;
  const spec = podSpecFromTemplate(t, { entrypoints: { "img:dev": ["/bin/img"] }, extra: (name) => ({ readinessGates: [`gate-${name}`] }) })("w-2");
  expect(spec.command(pod).cmd).toBe("/bin/img");
  expect(spec.readinessGates).toEqual(["gate-w-2"]);
});

test("what the simulation cannot run is refused, not ignored", () => {
  const withProbe = (probe: object) => {
    const t = structuredClone(template);
    t.spec.containers[0]!.readinessProbe = probe;
    return () => podSpecFromTemplate(t, { entrypoints: { serve: ["x"] } });
  };
  expect(withProbe({ exec: { command: ["true"] } })).toThrow(/readiness probes/);
  expect(withProbe({ tcpSocket: { port: "nope" } })).toThrow(/no port named nope/);
  expect(() => podSpecFromTemplate(template, { entrypoints: {} })).toThrow(/no entry point for "serve"/);
  const secret = structuredClone(template);
  secret.spec.containers[0]!.env!.push({ name: "S", valueFrom: { secretKeyRef: { name: "s", key: "k" } } } as never);
  expect(() => podSpecFromTemplate(secret, { entrypoints: { serve: ["x"] } })("p").command(pod)).toThrow(/only value and fieldRef/);
});

test("a Service's named targetPorts resolve to the pods' container ports", () => {
  const svc = {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: "peer" },
    spec: { selector: { app: "w" }, ports: [{ name: "web", port: 80, targetPort: "http" }, { name: "events", port: 5557 }, { name: "n", port: 1, targetPort: 2 }] },
  };
  expect(simServiceFromManifest(svc, template)).toEqual({
    name: "peer",
    selector: { app: "w" },
    ports: [
      { name: "web", port: 80, targetPort: 8000 },
      { name: "events", port: 5557, targetPort: 5557 },
      { name: "n", port: 1, targetPort: 2 },
    ],
  });
  expect(() => simServiceFromManifest({ ...svc, spec: { ...svc.spec, ports: [{ name: "x", port: 1, targetPort: "missing" }] } }, template)).toThrow(/names no container port/);
});
