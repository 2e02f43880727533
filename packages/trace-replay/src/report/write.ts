// Writes a report: `<name>.html` (the whole report) and, when asked and a headless chromium is installed,
// `<name>.png` of its main chart (rendered from `<name>-main.html`, the chart alone at a fixed size).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ReportData } from "./data.ts";
import { renderReport } from "./html.ts";
import { screenshot, type PngOutcome } from "./png.ts";

export function writeReport(dir: string, name: string, data: ReportData, png: boolean): { html: string; png?: PngOutcome } {
  const html = join(dir, `${name}.html`);
  writeFileSync(html, renderReport(data));
  if (!png) return { html };
  const main = join(dir, `${name}-main.html`);
  writeFileSync(main, renderReport(data, { only: "main" }));
  return { html, png: screenshot(main, join(dir, `${name}.png`)) };
}

export function pngText(png: PngOutcome): string {
  return png.kind === "written" ? `png:    ${png.path}` : `png:    skipped (${png.reason})`;
}
