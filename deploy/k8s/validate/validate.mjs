// deploy/k8s/validate/validate.mjs: offline checks of lazykv's Kubernetes manifests (ctest
// deploy.k8s; no API server needed).
//
//   node validate.mjs [--lazykvd BIN] [--expect-fail] FILE.yaml...
//
// 1. Schema: every document is validated with kubernetes-models (the Kubernetes OpenAPI schemas
//    compiled to validators: types, required fields, enums, formats).
// 2. Unknown fields: those schemas allow any extra key, so a typo ("imagePullPolcy") would pass;
//    the fields of the objects a typo can hide in (pod spec, containers, probes, mounts, volumes,
//    env, ports, services, PDBs, claim templates) are checked against the field lists of the
//    same package's type declarations.
// 3. Consistency: a StatefulSet's serviceName is a headless Service; Service and PDB selectors
//    select the pod template; every volumeMount names a volume or claim template; ConfigMaps,
//    Secrets and their keys referenced by volumes and env exist; named targetPorts exist; the
//    daemon container requests a GPU; probes are exec probes running `lazykv ... ping` on
//    loopback (kubelet gRPC probes send no client certificate or token); the worker sidecar
//    shares /dev/shm (memory-backed emptyDir) with the daemon and the pod shares its process
//    namespace (CUDA IPC).
// 4. With --lazykvd BIN, the lazykvd.conf of every ConfigMap passes `lazykvd --check-config`.
// Exit 0 when every file passes (with --expect-fail: when every file fails), else 1.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { spawnSync } from "node:child_process";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);
const modelsDir = path.dirname(require.resolve("kubernetes-models/package.json"));

// Field names of an interface in a kubernetes-models .d.ts (top-level keys at 4 spaces).
const fieldCache = new Map();
function fields(rel) {
  if (!fieldCache.has(rel)) {
    const text = fs.readFileSync(path.join(modelsDir, rel + ".d.ts"), "utf8");
    const start = text.indexOf("export interface");
    const end = text.indexOf("\n}", start);
    const body = text.slice(start, end);
    const names = new Set();
    for (const m of body.matchAll(/^ {4}"([A-Za-z0-9_$.-]+)"\??:/gm)) names.add(m[1]);
    fieldCache.set(rel, names);
  }
  return fieldCache.get(rel);
}

let errors = [];
const err = (file, what) => errors.push(`${file}: ${what}`);

function strict(file, obj, rel, where) {
  if (obj === null || typeof obj !== "object") return;
  const known = fields(rel);
  for (const k of Object.keys(obj)) {
    if (!known.has(k)) err(file, `${where}: unknown field "${k}" (not in ${rel})`);
  }
}

function strictPod(file, spec, where) {
  strict(file, spec, "v1/PodSpec", where);
  for (const [i, c] of (spec.containers || []).entries()) {
    const w = `${where}.containers[${i}] (${c.name})`;
    strict(file, c, "v1/Container", w);
    for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      if (c[p]) {
        strict(file, c[p], "v1/Probe", `${w}.${p}`);
        if (c[p].exec) strict(file, c[p].exec, "v1/ExecAction", `${w}.${p}.exec`);
      }
    }
    for (const [j, m] of (c.volumeMounts || []).entries()) strict(file, m, "v1/VolumeMount", `${w}.volumeMounts[${j}]`);
    for (const [j, e] of (c.env || []).entries()) {
      strict(file, e, "v1/EnvVar", `${w}.env[${j}]`);
      if (e.valueFrom) strict(file, e.valueFrom, "v1/EnvVarSource", `${w}.env[${j}].valueFrom`);
    }
    for (const [j, p] of (c.ports || []).entries()) strict(file, p, "v1/ContainerPort", `${w}.ports[${j}]`);
    if (c.resources) strict(file, c.resources, "v1/ResourceRequirements", `${w}.resources`);
  }
  for (const [i, v] of (spec.volumes || []).entries()) {
    strict(file, v, "v1/Volume", `${where}.volumes[${i}]`);
    if (v.emptyDir) strict(file, v.emptyDir, "v1/EmptyDirVolumeSource", `${where}.volumes[${i}].emptyDir`);
    if (v.secret) strict(file, v.secret, "v1/SecretVolumeSource", `${where}.volumes[${i}].secret`);
    if (v.configMap) strict(file, v.configMap, "v1/ConfigMapVolumeSource", `${where}.volumes[${i}].configMap`);
  }
}

function selects(sel, labels) {
  return Object.entries(sel || {}).every(([k, v]) => labels && labels[k] === v) && Object.keys(sel || {}).length > 0;
}

async function validateDoc(file, obj) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  const rel = group ? `${group}/${version}/${obj.kind}` : `${version}/${obj.kind}`;
  let mod;
  try {
    mod = await import(`kubernetes-models/${rel}`);
  } catch (e) {
    err(file, `unknown kind ${obj.apiVersion} ${obj.kind}`);
    return;
  }
  try {
    new mod[obj.kind](obj).validate();
  } catch (e) {
    err(file, `${obj.kind}/${obj.metadata?.name}: schema: ${e.message.split("\n")[0]}`);
  }
  strict(file, obj, rel, `${obj.kind}/${obj.metadata?.name}`);
  if (obj.spec && ["Service", "PodDisruptionBudget", "StatefulSet"].includes(obj.kind)) {
    const specRel = { Service: "v1/ServiceSpec", PodDisruptionBudget: "policy/v1/PodDisruptionBudgetSpec", StatefulSet: "apps/v1/StatefulSetSpec" }[obj.kind];
    strict(file, obj.spec, specRel, `${obj.kind}/${obj.metadata.name}.spec`);
  }
  if (obj.kind === "StatefulSet") {
    strictPod(file, obj.spec.template.spec, `StatefulSet/${obj.metadata.name}.template.spec`);
    for (const [i, t] of (obj.spec.volumeClaimTemplates || []).entries()) {
      strict(file, t.spec, "v1/PersistentVolumeClaimSpec", `StatefulSet/${obj.metadata.name}.volumeClaimTemplates[${i}].spec`);
    }
  }
}

function consistency(file, docs) {
  const by = (kind) => docs.filter((d) => d.kind === kind);
  const named = (kind, name) => by(kind).find((d) => d.metadata.name === name);
  for (const ss of by("StatefulSet")) {
    const n = `StatefulSet/${ss.metadata.name}`;
    const pod = ss.spec.template;
    const labels = pod.metadata?.labels;
    if (!selects(ss.spec.selector.matchLabels, labels)) err(file, `${n}: selector does not select its pod template`);
    const svc = named("Service", ss.spec.serviceName);
    if (!svc) err(file, `${n}: serviceName ${ss.spec.serviceName} is not a Service here`);
    else if (svc.spec.clusterIP !== "None") err(file, `${n}: serviceName ${ss.spec.serviceName} is not headless`);
    const vols = new Set([...(pod.spec.volumes || []).map((v) => v.name), ...(ss.spec.volumeClaimTemplates || []).map((t) => t.metadata.name)]);
    const portNames = new Set();
    for (const c of pod.spec.containers) {
      for (const p of c.ports || []) if (p.name) portNames.add(p.name);
      for (const m of c.volumeMounts || []) if (!vols.has(m.name)) err(file, `${n}: ${c.name} mounts unknown volume ${m.name}`);
      for (const e of c.env || []) {
        const ref = e.valueFrom?.secretKeyRef || e.valueFrom?.configMapKeyRef;
        if (!ref) continue;
        const kind = e.valueFrom.secretKeyRef ? "Secret" : "ConfigMap";
        const o = named(kind, ref.name);
        const keys = o ? { ...(o.data || {}), ...(o.stringData || {}) } : {};
        if (!o) err(file, `${n}: ${c.name} env ${e.name} refers to missing ${kind} ${ref.name}`);
        else if (!(ref.key in keys)) err(file, `${n}: ${c.name} env ${e.name}: ${kind} ${ref.name} has no key ${ref.key}`);
      }
      for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const pr = c[p];
        if (!pr) continue;
        if (!pr.exec) { err(file, `${n}: ${c.name}.${p} is not an exec probe (kubelet gRPC/HTTP probes cannot pass TLS + tokens)`); continue; }
        const cmd = pr.exec.command.join(" ");
        if (ss.metadata.name === "lazykv" && !/lazykv .*--addr 127\.0\.0\.1:\d+ .*ping$/.test(cmd)) err(file, `${n}: ${c.name}.${p} does not run lazykv ping on loopback: ${cmd}`);
      }
    }
    for (const v of pod.spec.volumes || []) {
      if (v.configMap && !named("ConfigMap", v.configMap.name)) err(file, `${n}: volume ${v.name}: no ConfigMap ${v.configMap.name}`);
      if (v.secret) {
        const s = named("Secret", v.secret.secretName);
        // An optional Secret may be absent (Kubernetes then mounts an empty volume).
        if (!s && v.secret.optional !== true) err(file, `${n}: volume ${v.name}: no Secret ${v.secret.secretName}`);
        for (const it of v.secret.items || []) if (s && !(it.key in { ...(s.data || {}), ...(s.stringData || {}) })) err(file, `${n}: volume ${v.name}: Secret has no key ${it.key}`);
      }
    }
    for (const svc2 of by("Service")) {
      if (selects(svc2.spec.selector, labels)) {
        for (const p of svc2.spec.ports) if (typeof p.targetPort === "string" && !portNames.has(p.targetPort)) err(file, `Service/${svc2.metadata.name}: targetPort ${p.targetPort} is no container port of ${n}`);
      }
    }
    if (ss.metadata.name === "lazykv") {
      const d = pod.spec.containers.find((c) => c.name === "lazykvd");
      const w = pod.spec.containers.find((c) => c.name === "worker");
      if (!d) err(file, `${n}: no lazykvd container`);
      else if (!d.resources?.limits?.["nvidia.com/gpu"]) err(file, `${n}: lazykvd requests no GPU`);
      if (!w) err(file, `${n}: no worker sidecar`);
      // The sidecar runs lazykv-worker from the daemon's own image against the daemon on loopback.
      if (d && w && w.image !== d.image) err(file, `${n}: the worker's image ${w.image} is not the daemon's ${d.image}`);
      const wcmd = w ? [...(w.command || []), ...(w.args || [])].join(" ") : "";
      if (w && !/(^|\/)lazykv-worker .*--daemon 127\.0\.0\.1:\d+/.test(wcmd)) err(file, `${n}: the worker does not run lazykv-worker --daemon on loopback: ${wcmd}`);
      if (w && !/--serve \S+:\d+/.test(wcmd)) err(file, `${n}: the worker serves no lazykv.v1.Worker port (--serve): ${wcmd}`);
      // The probes' lazykv takes its TLS options from LAZYKV_TLS_* (empty: plaintext).
      for (const k of ["LAZYKV_TLS_CA", "LAZYKV_TLS_CERT", "LAZYKV_TLS_KEY", "LAZYKV_TLS_SERVER_NAME"]) {
        if (d && !(d.env || []).some((e) => e.name === k)) err(file, `${n}: lazykvd sets no ${k} for its probes (TLS)`);
      }
      const shm = (pod.spec.volumes || []).find((v) => v.emptyDir?.medium === "Memory");
      if (!shm) err(file, `${n}: no memory-backed volume for the shared-memory arena`);
      for (const c of [d, w]) if (c && shm && !(c.volumeMounts || []).some((m) => m.name === shm.name && m.mountPath === "/dev/shm")) err(file, `${n}: ${c.name} does not mount ${shm.name} at /dev/shm`);
      if (pod.spec.shareProcessNamespace !== true) err(file, `${n}: the pod does not share its process namespace (CUDA IPC between daemon and worker)`);
      if (!(ss.spec.volumeClaimTemplates || []).some((t) => (d?.volumeMounts || []).some((m) => m.name === t.metadata.name))) err(file, `${n}: no claim template mounted by lazykvd (RocksDB)`);
    }
  }
  for (const pdb of by("PodDisruptionBudget")) {
    const sel = pdb.spec.selector?.matchLabels;
    if (!by("StatefulSet").some((s) => selects(sel, s.spec.template.metadata?.labels))) err(file, `PodDisruptionBudget/${pdb.metadata.name}: selects no pod template here`);
  }
  for (const svc of by("Service")) {
    if (!by("StatefulSet").some((s) => selects(svc.spec.selector, s.spec.template.metadata?.labels))) err(file, `Service/${svc.metadata.name}: selects no pod template here`);
  }
}

function checkConfig(file, docs, lazykvd) {
  for (const cm of docs.filter((d) => d.kind === "ConfigMap")) {
    const conf = cm.data?.["lazykvd.conf"];
    if (!conf) continue;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "lkv-k8s-"));
    const p = path.join(dir, "lazykvd.conf");
    fs.writeFileSync(p, conf);
    // Per-pod values the StatefulSet passes on the command line.
    const r = spawnSync(lazykvd, ["--config", p, "--check-config", "--set", "cluster_id=lazykv-0", "--set", "cluster_advertise=10.0.0.5:7070"], { encoding: "utf8" });
    fs.rmSync(dir, { recursive: true, force: true });
    if (r.status !== 0) err(file, `ConfigMap/${cm.metadata.name}: lazykvd --check-config: ${(r.stderr || r.stdout).trim()}`);
  }
}

const args = process.argv.slice(2);
let lazykvd = null, expectFail = false;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--lazykvd") lazykvd = args[++i];
  else if (args[i] === "--expect-fail") expectFail = true;
  else files.push(args[i]);
}
let bad = 0;
for (const f of files) {
  errors = [];
  const docs = [];
  for (const d of parseAllDocuments(fs.readFileSync(f, "utf8"))) {
    if (d.errors.length) err(f, `YAML: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o) docs.push(o);
  }
  for (const o of docs) await validateDoc(f, o);
  consistency(f, docs);
  if (lazykvd) checkConfig(f, docs, lazykvd);
  const kinds = docs.map((d) => d.kind).join(", ");
  if (errors.length) {
    bad++;
    console.log(`${expectFail ? "rejected (as expected)" : "FAIL"} ${f}:\n  ${errors.join("\n  ")}`);
  } else {
    console.log(`${expectFail ? "FAIL: accepted" : "ok"} ${f} (${docs.length} objects: ${kinds})`);
  }
}
process.exit(expectFail ? (bad === files.length ? 0 : 1) : bad === 0 ? 0 : 1);
