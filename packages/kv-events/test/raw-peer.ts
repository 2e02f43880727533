// Test helper: a hand-driven ZMTP peer over a raw TCP socket, to speak exactly ZMTP 3.0
// (or send garbage) where libzmq would always speak 3.1 correctly.
import { connect, type Socket } from "node:net";
import { parseEndpoint } from "@kv-epp/protocol";
import { ZmtpParser } from "../src/zmtp/parser.ts";
import { encodeGreeting, encodeReady, FLAG_COMMAND, parseCommand, type SocketType } from "../src/zmtp/wire.ts";

export type RawFrame = { flags: number; body: Buffer };

export class RawPeer {
  readonly frames: RawFrame[] = [];
  closed = false;
  greeting: Buffer | undefined;
  private constructor(readonly sock: Socket) {}

  static async open(endpoint: string): Promise<RawPeer> {
    const { host, port } = parseEndpoint(endpoint);
    const sock = connect({ host, port });
    const peer = new RawPeer(sock);
    const parser = new ZmtpParser(
      {
        greeting: (g) => void (peer.greeting = Buffer.from(g)),
        frame: (flags, body) => void peer.frames.push({ flags, body: Buffer.from(body) }),
      },
      1 << 30,
    );
    sock.on("data", (d: Buffer) => parser.push(d));
    sock.on("close", () => (peer.closed = true));
    sock.on("error", () => {});
    await new Promise<void>((r) => sock.once("connect", () => r()));
    return peer;
  }

  /** Greeting (given minor version) + READY with the given socket type. */
  static async handshake(endpoint: string, minor: number, type: SocketType): Promise<RawPeer> {
    const p = await RawPeer.open(endpoint);
    p.write(encodeGreeting(minor, false));
    p.write(encodeReady(type));
    return p;
  }

  write(b: Uint8Array): void {
    this.sock.write(b);
  }

  commands(name: string): Buffer[] {
    return this.frames.filter((f) => f.flags & FLAG_COMMAND).map((f) => parseCommand(f.body)!).filter((c) => c.name === name).map((c) => c.data);
  }

  dataFrames(): Buffer[] {
    return this.frames.filter((f) => !(f.flags & FLAG_COMMAND)).map((f) => f.body);
  }

  close(): void {
    this.sock.destroy();
  }
}
