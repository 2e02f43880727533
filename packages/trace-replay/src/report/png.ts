// PNG of a rendered HTML file through a headless chromium, when one is installed. CI machines may have
// none: then this returns a reason and the caller carries on.
import { spawnSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";

export type PngOutcome = { kind: "written"; path: string } | { kind: "skipped"; reason: string };

export function findChromium(): string | undefined {
  for (const name of ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]) {
    const found = Bun.which(name);
    if (found) return found;
  }
  return undefined;
}

export function screenshot(htmlPath: string, pngPath: string, size = { width: 1200, height: 560 }): PngOutcome {
  const chromium = findChromium();
  if (!chromium) return { kind: "skipped", reason: "no headless chromium on PATH (apt-get install chromium)" };
  const r = spawnSync(
    chromium,
    [
      "--headless",
      // Sandboxing needs user namespaces, often missing in containers and as root.
      "--no-sandbox",
      "--disable-gpu",
      "--hide-scrollbars",
      `--window-size=${size.width},${size.height}`,
      "--virtual-time-budget=5000",
      `--screenshot=${pngPath}`,
      `file://${htmlPath}`,
    ],
    { timeout: 60_000, encoding: "utf8" },
  );
  if (r.status === 0 && existsSync(pngPath) && statSync(pngPath).size > 0) return { kind: "written", path: pngPath };
  return { kind: "skipped", reason: `chromium failed (status ${r.status}): ${(r.stderr ?? "").trim().split("\n").slice(-2).join(" | ")}` };
}
