// A Deployment for the cluster simulation: keeps `replicas` pods of the current template running
// (a deleted pod is replaced, as the ReplicaSet controller does) and rolls out a new template one pod
// at a time with maxSurge 1 / maxUnavailable 0, the strategy deploy/base uses: a new pod must be
// ready before an old one is deleted.
import { waitFor } from "../wait.ts";
import type { SimCluster, SimPodSpec } from "./sim.ts";

export type SimDeploymentOptions = {
  name: string;
  replicas: number;
  labels: Record<string, string>;
  template: (podName: string) => Omit<SimPodSpec, "name" | "labels">;
  /** How long a rollout waits for each new pod to become ready, default 60 s. */
  readyTimeoutMs?: number;
  periodMs?: number; // reconcile period, default 100
};

const GENERATION_LABEL = "testkit.kv-epp.dev/generation";

export class SimDeployment {
  private generation = 1;
  private rolling = false;
  private readonly timer: ReturnType<typeof setInterval>;
  private readonly ownLabel: string;

  constructor(
    private readonly sim: SimCluster,
    readonly opts: SimDeploymentOptions,
  ) {
    this.ownLabel = `testkit.kv-epp.dev/deployment=${opts.name}`;
    this.reconcile();
    this.timer = setInterval(() => this.reconcile(), opts.periodMs ?? 100);
  }

  /** Pods of this deployment that exist, terminating ones included. */
  pods(): string[] {
    return this.sim.podNames(this.ownLabel);
  }

  /** Pods that are ready and not terminating. */
  readyPods(): string[] {
    return this.pods().filter((p) => this.sim.podState(p) === "running" && this.sim.isReady(p));
  }

  private live(): string[] {
    return this.pods().filter((p) => this.sim.podState(p) === "running");
  }

  private create(): string {
    const name = `${this.opts.name}-g${this.generation}-${Math.random().toString(36).slice(2, 7)}`;
    this.sim.runPod({
      ...this.opts.template(name),
      name,
      labels: { ...this.opts.labels, "testkit.kv-epp.dev/deployment": this.opts.name, [GENERATION_LABEL]: String(this.generation) },
    });
    return name;
  }

  /** The ReplicaSet's level-triggered loop: as many live pods as replicas (outside a rollout). */
  private reconcile(): void {
    if (this.rolling) return;
    const live = this.live();
    for (let i = live.length; i < this.opts.replicas; i++) this.create();
  }

  /** `kubectl rollout restart`: replaces every pod, one at a time, never below `replicas` ready. */
  async rolloutRestart(): Promise<string[]> {
    this.rolling = true;
    try {
      const old = this.live();
      this.generation++;
      const fresh: string[] = [];
      for (const victim of old) {
        const pod = this.create();
        fresh.push(pod);
        await waitFor(() => this.sim.isReady(pod), { timeoutMs: this.opts.readyTimeoutMs ?? 60_000, message: `${pod} ready during the rollout` });
        void this.sim.deletePod(victim, { wait: false });
      }
      return fresh;
    } finally {
      this.rolling = false;
    }
  }

  /** Stops managing (the pods stay until the cluster closes). */
  stop(): void {
    clearInterval(this.timer);
  }
}
