/** A fixed-width text table: first column left-aligned, the rest right-aligned. */
export function formatTable(columns: string[], rows: string[][]): string {
  const widths = columns.map((c, i) => Math.max(c.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  ");
  return [line(columns), widths.map((w) => "-".repeat(w)).join("  "), ...rows.map(line)].join("\n");
}

export const pct = (x: number) => `${(x * 100).toFixed(1)}%`;
export const ms = (x: number) => (Number.isFinite(x) ? (x >= 100 ? x.toFixed(0) : x.toFixed(1)) : "-");
export const rate = (x: number) => (!Number.isFinite(x) ? "-" : x >= 1e6 ? `${(x / 1e6).toFixed(1)}M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)}k` : x.toFixed(0));
