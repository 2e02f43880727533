// Opens an HTML report in headless Chromium (puppeteer-core, the browser installed on the machine) and
// reports what a reader would see: console errors, and per chart whether each series named in its
// legend drew. A series counts as drawn when, shown alone, pixels of its colour appear inside the
// chart's plot areas (the legend's own swatch lies outside them), counted per plot area (grid) for
// charts of several panels.
import puppeteer from "puppeteer-core";
import { findChromium } from "../src/report/png.ts";

/** `pixels`: over every grid of the chart; `perGrid`: in each grid, in the chart's grid order. */
export type ChartSeen = { id: string; series: { name: string; pixels: number; perGrid: number[] }[] };
export type ReportSeen = { errors: string[]; charts: ChartSeen[] };

export const chromiumPath = findChromium();

export async function openReport(htmlPath: string): Promise<ReportSeen> {
  if (!chromiumPath) throw new Error("no chromium on PATH");
  const browser = await puppeteer.launch({
    executablePath: chromiumPath,
    headless: true,
    pipe: true,
    // Sandboxing needs user namespaces, often missing in containers and as root.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 900, deviceScaleFactor: 1 });
    const errors: string[] = [];
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(m.text());
    });
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("requestfailed", (r) => errors.push(`request failed: ${r.url()}`));
    await page.goto(`file://${htmlPath}`, { waitUntil: "load" });
    const charts = await page.evaluate(inPage);
    return { errors, charts };
  } finally {
    await browser.close();
  }
}

/** Runs in the page: every echarts instance, each legend series shown alone, its colour counted in the grid. */
function inPage(): ChartSeen[] {
  // The few DOM shapes used here (the project compiles without the DOM library).
  type Ctx = { fillStyle: string; getImageData(x: number, y: number, w: number, h: number): { data: Uint8ClampedArray } };
  type Canvas = { getContext(kind: "2d"): Ctx | null };
  type El = { id: string; querySelector(sel: string): Canvas | null };
  const document = (globalThis as unknown as { document: { querySelectorAll(sel: string): ArrayLike<El>; createElement(tag: "canvas"): Canvas } }).document;
  type Rect = { x: number; y: number; width: number; height: number };
  type EChart = {
    getOption(): { series: { name: string }[]; legend?: { data?: unknown[] }[] };
    getModel(): {
      getComponent(kind: string, index?: number): { coordinateSystem: { getRect(): Rect } } | undefined;
      getSeriesByName(name: string): { getData(): { getVisual(k: string): { stroke?: string; fill?: string } | string } }[];
    };
    dispatchAction(a: { type: string; name?: string }): void;
    getDom(): El;
    getZr(): { flush(): void };
  };
  const ec = (globalThis as unknown as { echarts: { getInstanceByDom(el: El): EChart | undefined } }).echarts;
  const rgb = (color: string): [number, number, number] => {
    const probe = document.createElement("canvas").getContext("2d")!;
    probe.fillStyle = color;
    const hex = probe.fillStyle as string; // normalised to #rrggbb
    return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)) as [number, number, number];
  };
  const out: ChartSeen[] = [];
  for (const el of Array.from(document.querySelectorAll(".chart"))) {
    const chart = ec.getInstanceByDom(el);
    if (!chart) {
      out.push({ id: el.id, series: [] });
      continue;
    }
    // A legend entry may name several series (one per panel): each name once.
    const names = [...new Set(chart.getOption().series.map((s) => s.name))];
    const rects: Rect[] = [];
    for (let g = 0; ; g++) {
      const grid = chart.getModel().getComponent("grid", g);
      if (!grid) break;
      rects.push(grid.coordinateSystem.getRect());
    }
    const canvas = chart.getDom().querySelector("canvas")!;
    const series = names.map((name) => {
      for (const other of names) chart.dispatchAction({ type: other === name ? "legendSelect" : "legendUnSelect", name: other });
      // Redrawn on the next animation frame otherwise: paint now, so the pixels are this selection's.
      chart.getZr().flush();
      const style = chart.getModel().getSeriesByName(name)[0]!.getData().getVisual("style");
      const color = typeof style === "string" ? style : (style.stroke ?? style.fill);
      if (!color) return { name, pixels: -1, perGrid: rects.map(() => -1) };
      const [r, g, b] = rgb(color);
      const perGrid = rects.map((rect) => {
        const px = canvas.getContext("2d")!.getImageData(Math.ceil(rect.x) + 1, Math.ceil(rect.y), Math.floor(rect.width) - 2, Math.floor(rect.height)).data;
        let pixels = 0;
        for (let i = 0; i < px.length; i += 4) {
          if (px[i + 3]! > 200 && Math.abs(px[i]! - r) + Math.abs(px[i + 1]! - g) + Math.abs(px[i + 2]! - b) < 40) pixels++;
        }
        return pixels;
      });
      return { name, pixels: perGrid.reduce((a, n) => a + n, 0), perGrid };
    });
    for (const name of names) chart.dispatchAction({ type: "legendSelect", name });
    out.push({ id: el.id, series });
  }
  return out;
}

/** What is wrong with a report as the browser showed it: console errors, charts or legend series that drew nothing. */
export function reportProblems(seen: ReportSeen): string[] {
  const out = seen.errors.map((e) => `console: ${e}`);
  if (seen.charts.length === 0) out.push("no chart on the page");
  for (const c of seen.charts) {
    if (c.series.length === 0) out.push(`${c.id}: empty chart`);
    for (const s of c.series) if (s.pixels <= 0) out.push(`${c.id}: series "${s.name}" drew nothing`);
  }
  return out;
}

/** Says, once per test file, why the browser checks are skipped. */
export function noteMissingBrowser(file: string): void {
  if (!chromiumPath) console.warn(`${file}: browser checks SKIPPED: no chromium on PATH (Debian: apt-get install chromium)`);
}
