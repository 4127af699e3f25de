// Issue 27 (build item 6, run ergonomics), with the real `moefit` binary:
//  - the default progress line is one compact line (step, loss, eval, lr,
//    tok/s, eta) within 100 columns; --verbose adds the stream figures,
//    which metrics.jsonl has either way;
//  - a run that fails or is refused prints the command that continues it:
//    the command line that ran, overrides and all, with --resume; typed as
//    printed it continues that run, and its `done:` line counts the steps it
//    trained ("done: 4 steps (5-8) in ...");
//  - a data file that is not a .tokens file says what it is and how to make
//    one; a missing one names the key's place in the config;
//  - `moefit inspect` summarises a run dir, a checkpoint (verifying its files)
//    and a LoRA adapter dir;
//  - `moefit plot` draws a run's curves as SVG;
//  - hardware.profile auto on cpu measures this machine once into
//    runs/hw/cpu.yaml (tests keep the bundled profile: MF_CPU_PROFILE=bundled).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

bool has(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> lines_with(const std::string &text, const std::string &part) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (has(line, part)) v.push_back(line);
  return v;
}

// What follows `lead` up to the end of its line ("" when absent).
std::string after(const std::string &text, const std::string &lead) {
  const size_t at = text.find(lead);
  if (at == std::string::npos) return "";
  const size_t from = at + lead.size();
  return text.substr(from, text.find('\n', from) - from);
}

size_t count(const std::string &text, const std::string &part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

std::string Train() {
  return text_tokens("ergo_train", 30000);
}
std::string Valid() {
  return text_tokens("ergo_valid", 3000);
}

// The demo shortened: 32-token sequences of 2, every other step logged,
// checkpoints written with training paused (each complete before the next
// step). `out` is the output.dir word's value as the shell reads it.
std::string Args(const std::string &out, int steps, const std::string &extra = "") {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.seq_len=32 "
         "train.micro_batch=2 "
         "train.warmup=1 train.log_every=2 train.eval_every=3 output.checkpoint_every=3 "
         "output.checkpoint_async=false train.steps=" +
         std::to_string(steps) + " data.train=" + Train() + " data.valid=" + Valid() + " output.dir=" + out +
         (extra.empty() ? "" : " " + extra);
}

// A finished run of 6 steps (checkpoints at 3 and 6, evaluations at 3 and 6), once per binary.
const std::string &Run6() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = fresh_dir("run6");
  Result r = moefit(Args(dir, 6));
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

TEST(Ergonomics, ProgressLineIsCompactAndVerboseAddsTheStreams) {
  const std::string a = Run6(), b = fresh_dir("run6_verbose");
  Result verbose = moefit(Args(b, 6, "--verbose"));
  ASSERT_EQ(verbose.code, 0) << verbose.out;
  Result plain = moefit(Args(fresh_dir("run6_plain"), 6));
  ASSERT_EQ(plain.code, 0) << plain.out;
  const std::vector<std::string> p = lines_with(plain.out, " tok/s"), v = lines_with(verbose.out, " tok/s");
  ASSERT_EQ(p.size(), 5u) << plain.out;  // steps 1, 2, 3 (evaluated), 4, 6
  ASSERT_EQ(v.size(), p.size()) << verbose.out;
  for (const std::string &l : p) {
    EXPECT_LE(l.size(), 100u) << l;
    EXPECT_EQ(l.rfind("step ", 0), 0u) << l;
    for (const char *part : {"  loss ", "  lr ", " tok/s", "  eta "})
      EXPECT_TRUE(has(l, part)) << part << ": " << l;
    for (const char *part : {"busy", " io ", "peak", "|g|", " aux ", "host "})
      EXPECT_FALSE(has(l, part)) << part << " in the default line: " << l;
  }
  EXPECT_TRUE(has(p[2], "step  3/6  loss ")) << p[2];
  EXPECT_TRUE(has(p[2], "  eval ")) << "step 3 evaluated: " << p[2];
  for (const std::string &l : v)
    for (const char *part : {"busy c ", " io ", "peak ", "|g| ", " aux "})
      EXPECT_TRUE(has(l, part)) << part << ": " << l;
  // metrics.jsonl has the stream figures either way.
  const std::string ma = read_file(a + "/metrics.jsonl"), mb = read_file(b + "/metrics.jsonl");
  EXPECT_EQ(count(ma, "\"compute_busy_s\":"), 5u) << ma;
  EXPECT_EQ(count(ma, "\"compute_busy_s\":null"), count(mb, "\"compute_busy_s\":null"));
  EXPECT_EQ(count(ma, "\"h2d_bytes\":"), 5u);
  // The flag is documented.
  Result help = moefit("train --help");
  EXPECT_TRUE(has(help.out, "[--verbose]")) << help.out;
  EXPECT_TRUE(has(help.out, "--verbose adds")) << help.out;
}

// A run that fails after a checkpoint: the hint is the command line that ran,
// quoted where a shell needs it, with --resume; run as printed, it continues
// that run (not another) and says which steps it trained.
TEST(Ergonomics, ResumeHintIsTheCommandThatRan) {
  const std::string dir = tmpdir() + "/hint dir";  // a space: the hint must quote it
  shell("rm -rf '" + dir + "'");
  const std::string args = Args("'" + dir + "'", 8, "train.lr=2e-3");
  // The failure is a test-only hook: the test build moefit_test reads it.
  Result failed = shell("MF_INJECT_FAIL=0:5 ./moefit_test " + args + " 2>&1");
  ASSERT_EQ(failed.code, 1) << failed.out;
  // The hint quotes the word whole, as a shell reads it back.
  std::string want = "./moefit " + Args("@", 8, "train.lr=2e-3") + " --resume";
  want.replace(want.find("output.dir=@"), 12, "'output.dir=" + dir + "'");
  EXPECT_EQ(after(failed.out, "\nresume with: "), "./moefit_test" + want.substr(8)) << failed.out;
  // As printed, it resumes this run from step 3's checkpoint and trains steps 4-8 only.
  Result resumed = shell(after(failed.out, "\nresume with: ") + " 2>&1");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "resumed from " + dir + "/checkpoints/step-000003 (step 3)")) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "\ndone: 5 steps (4-8) in ")) << resumed.out;
  EXPECT_FALSE(has(resumed.out, "done: 8 steps")) << resumed.out;
  // Run again without --resume: refused, with the same command to continue it.
  Result refused = shell("./moefit " + args + " 2>&1");
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_TRUE(has(refused.out, "Continue it with `" + want + "`")) << refused.out;
  // A fresh run says "done: N steps in" as before.
  Result fresh = moefit(Args(fresh_dir("hint_fresh"), 4));
  EXPECT_TRUE(has(fresh.out, "\ndone: 4 steps in ")) << fresh.out;
}

// The moefit users build is no test build: a test-only hook in its
// environment is said once and ignored; the test build moefit_test obeys it.
TEST(Ergonomics, TheUsersMoefitIgnoresTestOnlyHooks) {
  const std::string prod = fresh_dir("hook_prod"), test = fresh_dir("hook_test");
  Result r = shell("MF_INJECT_FAIL=0:2 ./moefit " + Args(prod, 3, "data.valid=null") + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "MF_INJECT_FAIL is a test-only hook and this moefit is not a test build: ignored"), 1u)
      << r.out;
  EXPECT_TRUE(has(r.out, "\ndone: 3 steps in ")) << r.out;
  Result t = shell("MF_INJECT_FAIL=0:2 ./moefit_test " + Args(test, 3, "data.valid=null") + " 2>&1");
  EXPECT_EQ(t.code, 1) << t.out;
  EXPECT_TRUE(has(t.out, "MF_INJECT_FAIL=0:2: a test-only hook is on")) << t.out;
  EXPECT_TRUE(has(t.out, "step 2: the failure MF_INJECT_FAIL=0:2 asked for")) << t.out;
}

TEST(Ergonomics, DataFilesThatAreNotTokensSayWhatTheyAre) {
  const std::string d = tmpdir();
  const std::string base =
      "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null "
      "output.dir=" +
      d + "/data_run ";
  write_file(d + "/corpus.jsonl", "{\"text\": \"the first document\"}\n{\"text\": \"the second\"}\n");
  Result jsonl = moefit(base + "data.train=" + d + "/corpus.jsonl");
  EXPECT_EQ(jsonl.code, 1) << jsonl.out;
  EXPECT_TRUE(
      has(jsonl.out, "moefit train: error: command line: data.train: " + d +
                         "/corpus.jsonl: not a .tokens file: it is JSONL text, one JSON object a line (it "
                         "begins \"{\"text\": \"the first document\"}\")"))
      << jsonl.out;
  EXPECT_TRUE(has(jsonl.out, "`tools/prepare_data.py --tokenizer MODEL_DIR " + d + "/corpus.jsonl --out " +
                                 d + "/corpus.tokens`"))
      << jsonl.out;
  EXPECT_TRUE(has(jsonl.out, "`moefit data bytes " + d + "/corpus.jsonl " + d + "/corpus.tokens`"))
      << jsonl.out;
  EXPECT_FALSE(has(jsonl.out, "truncated header")) << jsonl.out;

  write_file(d + "/notes.txt", "plain words about the model\nand more of them\n");
  Result text = moefit("eval configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml --tokens " + d +
                       "/notes.txt");
  EXPECT_EQ(text.code, 1) << text.out;
  EXPECT_TRUE(has(text.out,
                  "moefit eval: error: --tokens: " + d + "/notes.txt: not a .tokens file: it is plain text"))
      << text.out;

  Result yaml = moefit(base + "data.train=" + Train() + " data.valid=configs/demo.yaml");
  EXPECT_TRUE(
      has(yaml.out, "command line: data.valid: configs/demo.yaml: not a .tokens file: it is YAML text"))
      << yaml.out;
  EXPECT_TRUE(has(yaml.out, "data.valid takes a .tokens file, not a config")) << yaml.out;

  const std::string weights = Run6() + "/final/model.safetensors";
  Result st = moefit(base + "data.train=" + weights);
  EXPECT_TRUE(has(st.out, weights + ": not a .tokens file: it is a safetensors file (model weights"))
      << st.out;

  write_file(d + "/empty.tokens", "");
  Result empty = moefit(base + "data.train=" + d + "/empty.tokens");
  EXPECT_TRUE(has(empty.out, d + "/empty.tokens: not a .tokens file: it is an empty file")) << empty.out;

  // A file with the magic keeps the reader's header fault.
  write_file(d + "/cut.tokens", "MFTOKENS" + std::string(20, '\0'));
  Result cut = moefit(base + "data.train=" + d + "/cut.tokens");
  EXPECT_TRUE(has(cut.out, "command line: data.train: " + d + "/cut.tokens: byte 28: truncated header"))
      << cut.out;

  // A missing file: the key's place in the config file (the demo's data is not made here).
  std::ifstream f("configs/demo.yaml");
  std::string line;
  int at = 0;
  for (int n = 1; std::getline(f, line); n++)
    if (line.rfind("  train: runs/demo/data/train.tokens", 0) == 0) at = n;
  ASSERT_GT(at, 0);
  Result missing = moefit(
      "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml output.dir=" + d + "/data_run");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_TRUE(has(missing.out, "moefit train: error: configs/demo.yaml:" + std::to_string(at) +
                                   ":3: data.train: runs/demo/data/train.tokens: No such file or directory"))
      << missing.out;
}

TEST(Ergonomics, InspectSummarisesRunsCheckpointsAndAdapters) {
  const std::string run = Run6();
  Result r = moefit("inspect " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string &part :
       {run + ": a training run\n", std::string("  steps         6 done of 6 planned (train.steps)\n"),
        std::string("  train loss    "), std::string(" (step 1) -> "), std::string("(mean of steps 5-6)"),
        std::string("  eval loss     "), std::string(" (step 3), "), std::string(" (step 6)\n"),
        std::string("  plan          predicted "),
        "  checkpoints   2 in " + run + "/checkpoints (2 complete): step 3, step 6\n",
        std::string("  final/        a Hugging Face model dir")})
    EXPECT_TRUE(has(r.out, part)) << part << " not in:\n" << r.out;

  // A checkpoint: every file verified, state.json's facts.
  const std::string ckpt = run + "/checkpoints/step-000006";
  Result c = moefit("inspect " + ckpt);
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c.out, ckpt + ": a resume checkpoint, complete\n")) << c.out;
  EXPECT_EQ(lines_with(c.out, "  ok").size(), 7u) << c.out;  // master, optimizer, state x2, config, plan, base
  EXPECT_TRUE(has(c.out, "every size and checksum matches manifest.json")) << c.out;
  EXPECT_TRUE(has(c.out, "  step          6 of train.steps 6 (0 skipped")) << c.out;
  EXPECT_TRUE(has(c.out, "  data          epoch ")) << c.out;
  // A damaged copy: the file named, exit 1; an unfinished one says so.
  const std::string bad = fresh_dir("bad_ckpt");
  ASSERT_EQ(shell("cp -r " + ckpt + " " + bad + " && printf 'X' | dd of=" + bad +
                  "/master.safetensors bs=1 seek=200 conv=notrunc 2>/dev/null && rm " + bad + "/COMPLETE")
                .code,
            0);
  Result d = moefit("inspect " + bad);
  EXPECT_EQ(d.code, 1) << d.out;
  EXPECT_TRUE(has(d.out, "INCOMPLETE (no COMPLETE marker")) << d.out;
  EXPECT_TRUE(has(after(d.out, "\nmaster.safetensors "), "CHECKSUM ")) << d.out;
  EXPECT_TRUE(has(d.out, "1 of them do NOT match manifest.json")) << d.out;
  EXPECT_TRUE(has(d.out, "moefit inspect: error: " + bad + ": 1 file damaged or missing")) << d.out;

  // A LoRA run's final/ is an adapter dir.
  const std::string lora = fresh_dir("lora_run");
  Result lr = moefit(Args(lora, 2, "train.lora.rank=4 train.lora.alpha=8"));
  ASSERT_EQ(lr.code, 0) << lr.out;
  Result a = moefit("inspect " + lora + "/final");
  ASSERT_EQ(a.code, 0) << a.out;
  for (const char *part :
       {": a LoRA adapter dir (PEFT", "  rank (r)      4\n", "  lora_alpha    8 (scale alpha/r = 2)",
        "  targets       q_proj, k_proj, v_proj, o_proj", " lora_A, ", " lora_B, "})
    EXPECT_TRUE(has(a.out, part)) << part << " not in:\n" << a.out;
  const Result run_dir = moefit("inspect " + lora);
  EXPECT_TRUE(has(run_dir.out, "  final/        a LoRA adapter dir")) << run_dir.out;

  // A half-written last line (a killed run) is counted, not a failure.
  const std::string killed = fresh_dir("killed_run");
  ASSERT_EQ(shell("mkdir -p " + killed + " && cp " + run + "/metrics.jsonl " + killed +
                  "/ && printf '{\"step\":7,\"lo' >> " + killed + "/metrics.jsonl")
                .code,
            0);
  Result k = moefit("inspect " + killed);
  ASSERT_EQ(k.code, 0) << k.out;
  EXPECT_TRUE(has(k.out, "  steps         6 done\n")) << k.out;
  EXPECT_TRUE(has(k.out, "1 line of metrics.jsonl not read")) << k.out;
  EXPECT_TRUE(has(k.out, "  final/        not there")) << k.out;
}

TEST(Ergonomics, PlotDrawsTheRun) {
  // A run resumed once: stopped at step 5 (checkpoint of 3), resumed to 8.
  const std::string dir = fresh_dir("plot_run");
  ASSERT_EQ(shell("MF_INJECT_FAIL=0:5 ./moefit_test " + Args(dir, 8) + " >/dev/null 2>&1").code, 1);
  Result resumed = moefit(Args(dir, 8, "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  Result p = moefit("plot " + dir);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(has(p.out, "wrote " + dir + "/curves.svg: 6 logged steps (to step 8), resumed")) << p.out;
  const std::string svg = read_file(dir + "/curves.svg");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << svg.substr(0, 200);
  EXPECT_TRUE(svg.size() > 7 && svg.compare(svg.size() - 7, 7, "</svg>\n") == 0);
  // The logged steps after the resume replace the ones it repeated: 1, 2, 3 (then 4 was redone), 4, 6, 8.
  const std::string loss = after(svg, "<path id=\"train-loss\"");
  EXPECT_EQ(count(loss, " M"), 1u) << loss;
  EXPECT_EQ(count(loss, " L"), 5u) << loss;
  EXPECT_EQ(count(svg, "<title>step "), 6u + 3u) << "a point per logged step and per evaluation (3, 6, 8)";
  EXPECT_EQ(count(svg, ": eval loss "), 3u);
  EXPECT_TRUE(has(svg, "resumed at step 3<title>" + dir + "/checkpoints/step-000003</title>")) << svg;
  EXPECT_TRUE(has(svg, "<path id=\"tokens-per-s\"")) << svg;
  // Well formed, where a python is at hand to say so.
  if (shell("command -v python3 >/dev/null").code == 0) {
    Result xml = shell("python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' " + dir +
                       "/curves.svg 2>&1");
    EXPECT_EQ(xml.code, 0) << xml.out;
  }
  // --out; RUN may be the metrics file itself.
  Result o = moefit("plot " + dir + "/metrics.jsonl --out " + tmpdir() + "/other.svg");
  ASSERT_EQ(o.code, 0) << o.out;
  EXPECT_EQ(read_file(tmpdir() + "/other.svg"), svg);
  // Not a run; the help; the command list.
  Result none = moefit("plot " + tmpdir() + "/no-such-run");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_TRUE(has(none.out, "moefit plot: error: " + tmpdir() + "/no-such-run: no such file or directory"))
      << none.out;
  Result empty = moefit("plot " + tmpdir());
  EXPECT_EQ(empty.code, 1) << empty.out;
  EXPECT_TRUE(has(empty.out, "no metrics.jsonl here")) << empty.out;
  EXPECT_TRUE(has(moefit("plot --help").out, "usage: moefit plot RUN [--out FILE.svg]"));
  EXPECT_TRUE(has(moefit("--help").out, "  plot      ")) << moefit("--help").out;
  EXPECT_EQ(moefit("plot").code, 2);
}

// hardware.profile auto on cpu: the first plan measures runs/hw/cpu.yaml and
// says so; later ones read it; MF_CPU_PROFILE=bundled (the tests' setting)
// keeps the bundled profile and measures nothing.
TEST(Ergonomics, CpuProfileAutoMeasuresOnce) {
  // Every test runs with it (tools/build_defs.bzl mf_test): no test measures unasked.
  ASSERT_NE(getenv("MF_CPU_PROFILE"), nullptr);
  EXPECT_STREQ(getenv("MF_CPU_PROFILE"), "bundled");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  const std::string bin = std::string(cwd) + "/moefit", cfg = std::string(cwd) + "/configs/demo.yaml";
  const std::string home = fresh_dir("profile_home");
  ASSERT_EQ(shell("mkdir -p " + home).code, 0);
  const std::string plan = "cd " + home + " && env -u MF_CPU_PROFILE " + bin + " plan " + cfg + " 2>&1";
  Result first = shell(plan);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_TRUE(has(first.out,
                  "hardware.profile auto: no cpu profile measured on this machine yet: measuring one once "
                  "(as `moefit profile --quick`, some seconds) into runs/hw/cpu.yaml"))
      << first.out;
  EXPECT_TRUE(has(first.out, "hardware.profile auto: wrote runs/hw/cpu.yaml in ")) << first.out;
  EXPECT_TRUE(has(first.out, "hardware profile runs/hw/cpu.yaml")) << first.out;
  EXPECT_TRUE(has(read_file(home + "/runs/hw/cpu.yaml"),
                  "hardware.profile auto (moefit profile --backend cpu --quick)"));
  Result second = shell(plan);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_FALSE(has(second.out, "measuring")) << second.out;
  EXPECT_TRUE(has(second.out, "hardware profile runs/hw/cpu.yaml")) << second.out;

  const std::string other = fresh_dir("profile_bundled");
  ASSERT_EQ(shell("mkdir -p " + other).code, 0);
  Result bundled = shell("cd " + other + " && MF_CPU_PROFILE=bundled " + bin + " plan " + cfg + " 2>&1");
  ASSERT_EQ(bundled.code, 0) << bundled.out;
  EXPECT_FALSE(has(bundled.out, "measuring")) << bundled.out;
  EXPECT_TRUE(has(bundled.out, "configs/hw/cpu-2core.yaml")) << bundled.out;
  EXPECT_NE(access((other + "/runs").c_str(), F_OK), 0);
}

}  // namespace
