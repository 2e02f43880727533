// Test helper: a libzmq peer in a Node child process (see zmq-peer.cjs), driven over stdio.
import { type ChildProcess, spawn } from "node:child_process";
import { join } from "node:path";
import { waitFor } from "@kv-epp/testkit";

const PKG_DIR = join(import.meta.dir, "..");
const live = new Set<ChildProcess>();

export type ZmqRole = "PUB" | "SUB" | "ROUTER" | "DEALER";

export class ZmqPeer {
  readonly messages: Buffer[][] = [];
  endpoint = "";
  /** Every JSON line the child printed. */
  readonly lines: Record<string, unknown>[] = [];
  private constructor(private readonly child: ChildProcess) {}

  static start(role: ZmqRole, mode: "bind" | "connect", endpoint: string): Promise<ZmqPeer> {
    return ZmqPeer.script("zmq-peer.cjs", [role, mode, endpoint]);
  }

  /** Runs test/<script> under Node; it must print {"ready": ...} (or {"error": ...}) first. */
  static async script(script: string, args: string[]): Promise<ZmqPeer> {
    // cwd = this package so require("zeromq") resolves to its devDependency.
    const child = spawn("node", [join(PKG_DIR, "test", script), ...args], {
      cwd: PKG_DIR,
      stdio: ["pipe", "pipe", "inherit"],
    });
    live.add(child);
    child.on("exit", () => live.delete(child));
    const peer = new ZmqPeer(child);
    let buf = "";
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const o = JSON.parse(buf.slice(0, i)) as Record<string, unknown>;
        buf = buf.slice(i + 1);
        if (Array.isArray(o.msg)) peer.messages.push((o.msg as string[]).map((h) => Buffer.from(h, "hex")));
        peer.lines.push(o);
      }
    });
    const ready = await waitUntil(() => peer.lines.find((l) => "ready" in l || "error" in l), 15_000);
    if ("error" in ready) throw new Error(`zmq peer failed: ${String(ready.error)}`);
    peer.endpoint = String(ready.ready);
    return peer;
  }

  command(cmd: object): void {
    this.child.stdin!.write(JSON.stringify(cmd) + "\n");
  }

  send(frames: Uint8Array[]): void {
    this.command({ send: frames.map((f) => Buffer.from(f).toString("hex")) });
  }

  subscribe(prefix: string): void {
    this.command({ subscribe: Buffer.from(prefix).toString("hex") });
  }

  kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return Promise.resolve();
    return new Promise((r) => {
      this.child.once("exit", () => r());
      this.child.kill("SIGKILL");
    });
  }
}

/** Kills every peer still alive (call from afterAll / afterEach). */
export async function killAllPeers(): Promise<void> {
  await Promise.all(
    [...live].map((c) => new Promise<void>((r) => {
      if (c.exitCode !== null || c.signalCode !== null) return r();
      c.once("exit", () => r());
      c.kill("SIGKILL");
    })),
  );
}

/** The testkit's waitFor with this package's tests' polling (10 ms) and the condition's source as its message. */
export function waitUntil<T>(fn: () => T | undefined | null | false, timeoutMs = 10_000): Promise<NonNullable<T>> {
  return waitFor(fn, { timeoutMs, intervalMs: 10, message: fn.toString().slice(0, 120) }) as Promise<NonNullable<T>>;
}
