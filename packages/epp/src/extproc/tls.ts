// The ext_proc port's certificate, as GAIE's EPP does it: secure serving by default, with a
// self-signed certificate made at start when no files are given (gateways open TLS to the EPP and
// skip verification), or the given PEM files, reloaded when they change (a renewed Secret).
import { watch, readFileSync, type FSWatcher } from "node:fs";
import { dirname } from "node:path";
import { createSecureContext } from "node:tls";
// node:crypto cannot issue X.509 certificates and the image must not depend on an openssl binary:
// `selfsigned` (on @peculiar/x509, WebCrypto) is the well-kept library that does.
import { generate } from "selfsigned";

export type Certificate = { cert: Buffer; key: Buffer };

/** A fresh self-signed ECDSA P-256 certificate for `host` (valid a year; the process restarts sooner). */
export async function selfSignedCertificate(host = "dynamo-epp"): Promise<Certificate> {
  const pems = await generate([{ name: "commonName", value: host }], {
    keyType: "ec",
    algorithm: "sha256",
    notAfterDate: new Date(Date.now() + 365 * 24 * 3600 * 1000),
    extensions: [{ name: "subjectAltName", altNames: [{ type: 2, value: host }] }],
  });
  return { cert: Buffer.from(pems.cert), key: Buffer.from(pems.private) };
}

/** Reads a PEM pair and checks it makes a TLS context (a mismatched key fails here, not at handshake). */
export function readCertificate(files: { certFile: string; keyFile: string }): Certificate {
  const c = { cert: readFileSync(files.certFile), key: readFileSync(files.keyFile) };
  createSecureContext(c);
  return c;
}

/** Debounce: a Secret update writes several files and swaps a symlink; reload once it has settled. */
const SETTLE_MS = 250;

/**
 * Watches the directories of the certificate files (Kubernetes swaps a Secret volume's `..data`
 * symlink, so the files themselves never see a write) and hands a changed, valid pair to `onChange`.
 * A pair that does not load is reported and the one in use is kept.
 */
export function watchCertificate(
  files: { certFile: string; keyFile: string },
  current: Certificate,
  on: { change(c: Certificate): void; error(err: Error): void },
): { stop(): void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let last = current;
  const reload = () => {
    timer = undefined;
    let next: Certificate;
    try {
      next = readCertificate(files);
    } catch (err) {
      on.error(err as Error);
      return;
    }
    if (next.cert.equals(last.cert) && next.key.equals(last.key)) return;
    last = next;
    on.change(next);
  };
  const watchers: FSWatcher[] = [];
  for (const dir of new Set([dirname(files.certFile), dirname(files.keyFile)])) {
    const w = watch(dir, () => {
      if (timer) clearTimeout(timer);
      timer = setTimeout(reload, SETTLE_MS);
    });
    w.on("error", (err) => on.error(err));
    watchers.push(w);
  }
  return {
    stop() {
      if (timer) clearTimeout(timer);
      for (const w of watchers) w.close();
    },
  };
}
