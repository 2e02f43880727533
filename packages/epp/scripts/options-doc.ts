// Rewrites the option tables of packages/epp/README.md from the declarations (src/options.ts).
import { readFileSync, writeFileSync } from "node:fs";
import { optionsMarkdown, withOptionsSection } from "@kv-epp/options";
import { EPP_OPTIONS, EPP_PROGRAM } from "../src/options.ts";

const path = `${import.meta.dir}/../README.md`;
writeFileSync(path, withOptionsSection(readFileSync(path, "utf8"), optionsMarkdown(EPP_OPTIONS, EPP_PROGRAM)));
console.log(`wrote the option tables of ${path}`);
