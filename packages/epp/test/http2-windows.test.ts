// The ext_proc server advertises wide HTTP/2 receive windows (src/extproc/http2-windows.ts): request
// bodies of 50-500 KB arrive in one message and must not wait on 64 KiB windows.
import { afterAll, expect, test } from "bun:test";
import { EXT_PROC_WINDOW_BYTES } from "../src/extproc/http2-windows.ts";
import { rawExtProcSession, startTestEpp } from "./helpers.ts";

const epp = await startTestEpp([]);
afterAll(() => epp.stop({ graceMs: 0 }));

test("stream and connection windows of the ext_proc server are 16 MiB", async () => {
  const session = rawExtProcSession(epp.ports.grpc);
  try {
    await new Promise<void>((resolve, reject) => {
      session.once("remoteSettings", () => resolve());
      session.once("error", reject);
    });
    expect(session.remoteSettings.initialWindowSize).toBe(EXT_PROC_WINDOW_BYTES);
    // The connection window arrives as a WINDOW_UPDATE right after the SETTINGS.
    const deadline = Date.now() + 5000;
    while ((session.state.remoteWindowSize ?? 0) < EXT_PROC_WINDOW_BYTES && Date.now() < deadline) await Bun.sleep(10);
    expect(session.state.remoteWindowSize).toBe(EXT_PROC_WINDOW_BYTES);
  } finally {
    session.destroy();
  }
});
