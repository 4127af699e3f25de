// issue 32: `mpirun -np N moefit train ... parallel.expert=N` — each rank owns
// E/N routed experts of every MoE layer and trains its own micro-batch; the
// rows routed to an expert travel to its rank and back (MPI point-to-point on
// the cpu backend). The final weights, every loss and the routing counts are
// those of one rank with N micro-batches, bit for bit: Mixtral-like (the demo,
// 8 experts top-2) with 2 and 4 ranks, and 2 x 2 (groups of 2, data parallel
// between them), streamed and staged, bf16 storage, and a Qwen3-like model
// whose experts go idle (64 experts, few tokens: an idle expert's zeros
// written by its owner alone); a failing or killed rank ends the job within
// 10 s; a run resumes bit for bit; the plan train writes is `moefit plan
// --ranks N`'s; what it cannot do is refused saying why.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include "cli_util.h"

namespace {

std::string Corpus() {
  return text_tokens("ep_corpus", 60000);
}

std::string Args(const std::string &out, const std::string &extra, int steps = 6) {
  return short_demo_args(Corpus(), out, extra, steps);
}

// A Qwen3-MoE of 64 experts top-2 over 8-token sequences: 16 rows a
// micro-batch, so many experts get no token in a step; layer 1 dense.
const char *kQwen3 =
    "model.init.family=qwen3_moe model.init.hidden=32 model.init.layers=3 model.init.heads=4 "
    "model.init.kv_heads=2 model.init.head_dim=8 model.init.experts=64 model.init.top_k=2 "
    "model.init.expert_ffn=16 model.init.dense_ffn=48 model.init.mlp_only_layers=[1] model.init.vocab=256 "
    "data.seq_len=8 train.micro_batch=1";

struct Variant {
  const char *name, *extra;
  const char *env = "";  // for every rank (mpirun -x)
};

// N ranks with grad_accum 1, in groups of `ep` expert-parallel ranks (N / ep
// groups, data parallel between them; ep 0: N), against one rank with
// grad_accum N.
void SameAsOneRank(int n, const Variant &v, int steps = 6, int ep = 0) {
  SCOPED_TRACE(v.name);
  if (ep == 0) ep = n;
  const std::string one = fresh_dir(std::string("ep_one_") + v.name),
                    many = fresh_dir(std::string("ep_many_") + v.name);
  const Result rn = ExpectRanksGiveOneRanksBits(
      n, one, Args(one, std::string(v.extra) + " train.grad_accum=" + std::to_string(n), steps), many,
      Args(many, std::string(v.extra) + " train.grad_accum=1 parallel.expert=" + std::to_string(ep), steps),
      v.env, steps);
  // The tokens each expert received, over every rank: the planner's routing statistics.
  EXPECT_EQ(read_file(one + "/routing.json"), read_file(many + "/routing.json"));
  const std::string line =
      ep == n ? "experts over " + std::to_string(n) + " (" + std::to_string(8 / n) + " of 8 a rank)"
              : "experts over groups of " + std::to_string(ep) + " (" + std::to_string(8 / ep) +
                    " of 8 a rank), " + std::to_string(n / ep) + " groups";
  const std::string nodes = *v.env ? std::to_string(n) + " nodes" : "1 node";  // MF_COMM_NODE_RANKS=1
  EXPECT_NE(rn.out.find("step: " + std::to_string(n) + " ranks (" + nodes + "), " + line), std::string::npos)
      << rn.out;
}

// 2 x 2: two groups of two expert-parallel ranks, data parallel between them.
// An expert's owner in the second group starts its gradient from the first
// group's sum, so 4 ranks still give one rank's bits over 4 micro-batches;
// resident, streamed and staged, and gpt-oss's expert biases (a gradient every
// rank holds, summed by parts).
TEST(ExpertParallel, TwoGroupsOfTwoGiveTheBitsOfOne) {
  SameAsOneRank(4, {"groups", ""}, 6, 2);
  SameAsOneRank(4, {"groups_streamed", "memory.device_budget=3MiB memory.staging=true"}, 6, 2);
  SameAsOneRank(4, {"groups_gpt_oss", "model.init.family=gpt_oss"}, 4, 2);
  SameAsOneRank(4,
                {"groups_lora_experts",
                 "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,w1,w2,w3] "
                 "train.lora.dropout=0.1"},
                4, 2);
}

// Over several nodes (simulated on this machine: MF_COMM_NODE_RANKS). One
// group of every rank, a rank a node: each node's home holds its rank's
// experts' gradients (the others' zeroed) and the leaders' exchange adds the
// rest in, so 2 ranks as 2 nodes give one rank's bits. Groups within nodes
// (4 ranks as 2 nodes of 2, parallel.expert=2) sum as data parallel over those
// nodes does: the very bits of 4 such data-parallel ranks. One group of 4 over
// 2 nodes of 2: two runs identical, and its losses within 1e-4 of one rank's.
TEST(ExpertParallel, AcrossNodes) {
  SameAsOneRank(2, {"nodes", "", "MF_COMM_NODE_RANKS=1"}, 4);
  SameAsOneRank(2,
                {"nodes_lora_experts",
                 "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,w1,w2,w3] "
                 "train.lora.dropout=0.1",
                 "MF_COMM_NODE_RANKS=1"},
                4);
  const std::string dp = fresh_dir("ep_nodes_dp"), groups = fresh_dir("ep_nodes_groups");
  Result rd = Mpirun(4, Args(dp, "train.grad_accum=1", 4), "MF_COMM_NODE_RANKS=2");
  ASSERT_EQ(rd.code, 0) << rd.out;
  Result rg = Mpirun(4, Args(groups, "train.grad_accum=1 parallel.expert=2", 4), "MF_COMM_NODE_RANKS=2");
  ASSERT_EQ(rg.code, 0) << rg.out;
  EXPECT_NE(rg.out.find("step: 4 ranks (2 nodes), experts over groups of 2"), std::string::npos) << rg.out;
  EXPECT_EQ(final_weights(dp), final_weights(groups));
  EXPECT_EQ(step_losses(dp), step_losses(groups));
  const std::string one = fresh_dir("ep_nodes_one"), a = fresh_dir("ep_nodes_a"), b = fresh_dir("ep_nodes_b");
  Result r1 = moefit(Args(one, "train.grad_accum=4", 4));
  ASSERT_EQ(r1.code, 0) << r1.out;
  for (const std::string &out : {a, b}) {
    Result r = Mpirun(4, Args(out, "train.grad_accum=1 parallel.expert=4", 4), "MF_COMM_NODE_RANKS=2");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  EXPECT_EQ(final_weights(a), final_weights(b));
  const auto la = step_losses(a), lb = step_losses(b), l1 = step_losses(one);
  EXPECT_EQ(la, lb);
  ASSERT_EQ(la.size(), l1.size());
  for (const auto &kv : l1) EXPECT_NEAR(std::stod(la.at(kv.first)), std::stod(kv.second), 1e-4) << kv.first;
}

// More than one micro-batch a rank: the gradients the ranks add in turn stay
// on the device over a rank's micro-batches and come home once (copied home
// after each, a rank's first copy waited for the rank before it to finish
// the step while that rank waited for it in an exchange: a hang). Each run
// ends (a hang would fail at MF_COMM_TIMEOUT_S=30), two runs are identical,
// and the losses are within 1e-4 of one rank's (the sums group by rank: not
// one rank's bits). 2 ranks, also streamed and staged, and 2 x 2.
TEST(ExpertParallel, SeveralMicroBatchesARank) {
  const struct {
    int n, ep;
    const char *name, *extra;
  } cases[] = {{2, 2, "g2", ""},
               {2, 2, "g2_streamed", "memory.device_budget=3MiB memory.staging=true"},
               {4, 2, "g2_groups", ""}};
  for (const auto &c : cases) {
    SCOPED_TRACE(c.name);
    const std::string one = fresh_dir(std::string("ep_one_") + c.name);
    Result r1 = moefit(Args(one, std::string(c.extra) + " train.grad_accum=" + std::to_string(2 * c.n), 3));
    ASSERT_EQ(r1.code, 0) << r1.out;
    std::string dirs[2];
    for (int k = 0; k < 2; k++) {
      dirs[k] = fresh_dir(std::string("ep_") + c.name + (k ? "_b" : "_a"));
      Result r = Mpirun(
          c.n,
          Args(dirs[k], std::string(c.extra) + " train.grad_accum=2 parallel.expert=" + std::to_string(c.ep),
               3),
          "MF_COMM_TIMEOUT_S=30");
      ASSERT_EQ(r.code, 0) << r.out;
    }
    EXPECT_EQ(final_weights(dirs[0]), final_weights(dirs[1]));
    const auto la = step_losses(dirs[0]), lb = step_losses(dirs[1]), l1 = step_losses(one);
    EXPECT_EQ(la, lb);
    ASSERT_EQ(la.size(), l1.size());
    for (const auto &kv : l1) EXPECT_NEAR(std::stod(la.at(kv.first)), std::stod(kv.second), 1e-4) << kv.first;
  }
}

TEST(ExpertParallel, TwoRanksGiveTheBitsOfOne) {
  SameAsOneRank(2, {"resident", ""});
}

TEST(ExpertParallel, FourRanksGiveTheBitsOfOne) {
  SameAsOneRank(4, {"four", ""});
}

// Weights and gradients streamed under a small budget through the staging
// arena (an idle expert's upload skipped, its zeros written home), and bf16.
TEST(ExpertParallel, StreamedStagedAndBf16) {
  SameAsOneRank(2, {"streamed", "memory.device_budget=3MiB memory.staging=true"});
  SameAsOneRank(2, {"bf16", "train.precision=bf16"});
}

// LoRA on attention with the experts frozen (adapter dropout drawn by the
// micro-batch's index among all ranks'), and over an NF4 base whose experts
// each rank dequantizes for its own, streamed and staged; LoRA on the experts
// too (their adapters' gradients by source rank's part), over fp32 — with
// adapter dropout, each received row masked as its source micro-batch masks
// it — and NF4.
TEST(ExpertParallel, LoraAndQlora) {
  SameAsOneRank(2, {"lora",
                    "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,v_proj] "
                    "train.lora.dropout=0.1"});
  SameAsOneRank(2, {"qlora",
                    "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,v_proj] "
                    "train.lora.base_dtype=nf4 train.lora.base_blocksize=32 memory.device_budget=3MiB "
                    "memory.staging=true"});
  SameAsOneRank(2, {"lora_experts",
                    "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,w1,w2,w3] "
                    "train.lora.dropout=0.1"});
  SameAsOneRank(4, {"qlora_experts",
                    "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,w1,w2,w3] "
                    "train.lora.base_dtype=nf4 train.lora.base_blocksize=32 memory.device_budget=3MiB "
                    "memory.staging=true"});
}

// gpt-oss: the expert biases over the received rows, their gradients by
// source rank's part as the weights'; sinks and sliding windows beside them.
TEST(ExpertParallel, GptOssExpertBiases) {
  SameAsOneRank(2, {"gpt_oss", "model.init.family=gpt_oss"});
  SameAsOneRank(4, {"gpt_oss4", "model.init.family=gpt_oss memory.device_budget=3MiB"});
}

// Many idle experts: the routing counts over the run have zeros, and the
// weights are still one rank's (an owner writes an idle expert's zeros; the
// optimizer leaves an expert without tokens alone on every rank).
// With 2 x 2 too: an owner in the second group whose expert got no token
// leaves the first group's sum as it is.
TEST(ExpertParallel, Qwen3LikeWithIdleExperts) {
  const std::string one = fresh_dir("ep_qwen_one"), many = fresh_dir("ep_qwen_many"),
                    groups = fresh_dir("ep_qwen_groups");
  const std::string model = std::string(kQwen3) + " model.init.experts=64";
  Result r1 = moefit(Args(one, model + " train.grad_accum=4", 3));
  ASSERT_EQ(r1.code, 0) << r1.out;
  Result r4 = Mpirun(4, Args(many, model + " train.grad_accum=1 parallel.expert=4", 3));
  ASSERT_EQ(r4.code, 0) << r4.out;
  Result rg = Mpirun(4, Args(groups, model + " train.grad_accum=1 parallel.expert=2", 3));
  ASSERT_EQ(rg.code, 0) << rg.out;
  EXPECT_EQ(final_weights(one), final_weights(many));
  EXPECT_EQ(step_losses(one), step_losses(many));
  EXPECT_EQ(final_weights(one), final_weights(groups)) << "2 x 2";
  EXPECT_EQ(step_losses(one), step_losses(groups)) << "2 x 2";
  const std::string routing = read_file(many + "/routing.json");
  EXPECT_EQ(read_file(one + "/routing.json"), routing);
  EXPECT_EQ(read_file(groups + "/routing.json"), routing);
  EXPECT_TRUE(routing.find("[0, ") != std::string::npos || routing.find(", 0,") != std::string::npos ||
              routing.find(", 0]") != std::string::npos)
      << "no expert went idle: the test shows nothing of them\n"
      << routing;
}

// Expert parallelism's code on one rank (MF_TEST_EP_SELF, the test build):
// its exchanges with itself give the bits of the run without them, G of 1 and
// 2, resident and streamed, and LoRA with dropout on the experts — what
// tools/gpu_ep_check.sh runs on one GPU over NCCL.
TEST(ExpertParallel, OneRankExchangingWithItselfGivesTheSameBits) {
  for (const char *extra :
       {"train.grad_accum=1", "train.grad_accum=2 memory.device_budget=3MiB",
        "train.lora.rank=4 train.lora.alpha=8 train.lora.targets=[q_proj,w1,w2,w3] train.lora.dropout=0.1"}) {
    SCOPED_TRACE(extra);
    const std::string plain = fresh_dir("ep_self_plain"), self = fresh_dir("ep_self");
    Result rp = moefit(Args(plain, extra));
    ASSERT_EQ(rp.code, 0) << rp.out;
    Result rs = shell("MF_TEST_EP_SELF=1 ./moefit_test " + Args(self, extra) + " 2>&1");
    ASSERT_EQ(rs.code, 0) << rs.out;
    EXPECT_NE(rs.out.find("1 rank exchanging its experts' rows with itself (MF_TEST_EP_SELF)"),
              std::string::npos)
        << rs.out;
    EXPECT_EQ(final_weights(plain), final_weights(self));
    EXPECT_EQ(step_losses(plain), step_losses(self));
    EXPECT_EQ(read_file(plain + "/routing.json"), read_file(self + "/routing.json"));
  }
}

TEST(ExpertParallel, AFailingRankEndsTheJob) {
  const std::string out = fresh_dir("ep_failing");
  const double t0 = wall_seconds();
  Result r = Mpirun(2, Args(out, "train.steps=50 parallel.expert=2"), "MF_INJECT_FAIL=1:3");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(wall_seconds() - t0, 10.0) << r.out;
  EXPECT_NE(r.out.find("moefit train: rank 1 of 2: error: step 3: the failure MF_INJECT_FAIL=1:3 asked for"),
            std::string::npos)
      << r.out;
  Result ps = shell("pgrep -f 'output.dir=" + out + "( |$)' || true");
  EXPECT_EQ(ps.out, "") << "left running: " << ps.out;
}

// A rank killed (SIGKILL) while the others wait for it in an exchange (or,
// 2 x 2, the other group's in the expert relay): mpirun ends the job; no
// process is left.
TEST(ExpertParallel, AKilledRankEndsTheJob) {
  for (const int n : {2, 4}) {
    SCOPED_TRACE(n);
    const std::string out = fresh_dir("ep_killed" + std::to_string(n));
    Background job("exec env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=" + tmpdir() +
                   " mpirun -np " + std::to_string(n) +
                   " --oversubscribe --mca pml ob1 --mca btl self,vader --mca "
                   "btl_vader_single_copy_mechanism none ./moefit " +
                   Args(out, "train.steps=100000 parallel.expert=2"));
    ASSERT_TRUE(job.WaitFor(std::regex("step +3/"), 0, 60.0)) << job.out();
    // the last rank: the newest of the processes
    Result pid = shell("pgrep -n -f 'moefit train.*output.dir=" + out + "( |$)'");
    ASSERT_FALSE(pid.out.empty()) << job.out();
    const double t0 = wall_seconds();
    shell("kill -9 " + pid.out);
    const int code = job.Finish();
    EXPECT_LT(wall_seconds() - t0, 10.0) << job.out();
    EXPECT_NE(code, 0) << job.out();
    Result ps = shell("pgrep -f 'output.dir=" + out + "( |$)' || true");
    EXPECT_EQ(ps.out, "") << "left running: " << ps.out;
  }
}

const char *kResumeExtra = "train.schedule=constant output.checkpoint_every=2";

// `ranks` ranks in groups of `ep` stopped after step `cut` (a checkpoint every
// 2) and resumed to `steps` with the same ranks: the bits of one rank with
// `ranks` micro-batches over the whole run (made in `whole`).
void ResumeSameAsOneRank(const std::string &whole, const std::string &cut, int ranks, int ep, int stop,
                         int steps) {
  const std::string mine =
      std::string(kResumeExtra) + " train.grad_accum=1 parallel.expert=" + std::to_string(ep);
  Result rw =
      moefit(Args(whole, std::string(kResumeExtra) + " train.grad_accum=" + std::to_string(ranks), steps));
  ASSERT_EQ(rw.code, 0) << rw.out;
  Result rc = Mpirun(ranks, Args(cut, mine, stop));
  ASSERT_EQ(rc.code, 0) << rc.out;
  Result r2 = Mpirun(ranks, Args(cut, mine, steps) + " --resume");
  ASSERT_EQ(r2.code, 0) << r2.out;
  char at[32];
  snprintf(at, sizeof at, "step-%06d (step %d)", stop, stop);
  EXPECT_NE(r2.out.find("resumed from " + cut + "/checkpoints/" + at), std::string::npos) << r2.out;
  EXPECT_EQ(final_weights(whole), final_weights(cut));
  EXPECT_EQ(step_losses(whole), step_losses(cut));
}

// Stopped after step 4 and resumed to 8 with the same ranks: one rank's bits
// over the 8 steps.
TEST(ExpertParallel, ResumeIsBitExact) {
  const std::string whole = fresh_dir("ep_resume_whole");
  ResumeSameAsOneRank(whole, fresh_dir("ep_resume_cut"), 2, 2, 4, 8);
  // A checkpoint holds every expert (the node's home): one rank with 2 micro-batches resumes it too.
  const std::string cut1 = fresh_dir("ep_resume_cut1");
  Result rc1 = Mpirun(2, Args(cut1, std::string(kResumeExtra) + " train.grad_accum=1 parallel.expert=2", 4));
  ASSERT_EQ(rc1.code, 0) << rc1.out;
  Result r1 = moefit(Args(cut1, std::string(kResumeExtra) + " train.grad_accum=2", 8) + " --resume");
  ASSERT_EQ(r1.code, 0) << r1.out;
  EXPECT_EQ(final_weights(whole), final_weights(cut1));
  EXPECT_EQ(step_losses(whole), step_losses(cut1));
}

// 2 x 2 stopped after step 2 and resumed to 4: one rank's bits with 4 micro-batches.
TEST(ExpertParallel, ResumeInGroupsIsBitExact) {
  ResumeSameAsOneRank(fresh_dir("ep_gresume_whole"), fresh_dir("ep_gresume_cut"), 4, 2, 2, 4);
}

TEST(ExpertParallel, PlanWithRanksIsWhatTrainRuns) {
  const std::string out = fresh_dir("ep_plan"), json = tmpdir() + "/ep_plan.json";
  const std::string plan =
      ExpectPlanIsWhatTrainRuns(2, Args(out, "memory.device_budget=3MiB parallel.expert=2"), out, json);
  EXPECT_NE(plan.find("experts: over 2 ranks (4 of 8 a rank"), std::string::npos) << plan;
  const std::string gout = fresh_dir("ep_plan_groups"), gjson = tmpdir() + "/ep_plan_groups.json";
  const std::string gplan =
      ExpectPlanIsWhatTrainRuns(4, Args(gout, "memory.device_budget=3MiB parallel.expert=2"), gout, gjson);
  EXPECT_NE(gplan.find("experts: over 2 ranks in each of 2 groups, data parallel between them"),
            std::string::npos)
      << gplan;
}

TEST(ExpertParallel, WhatItCannotDoIsRefused) {
  // ranks that groups of parallel.expert do not fill
  Result r = Mpirun(2, Args(fresh_dir("ep_bad_ranks"), "parallel.expert=4"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("parallel.expert 4: the run has 2 ranks; expert parallelism spreads the experts over "
                       "groups of 4 ranks"),
            std::string::npos)
      << r.out;
  Result r3 =
      moefit(Args(fresh_dir("ep_bad_ranks3"), "parallel.expert=2").replace(0, 5, "plan") + " --ranks 3");
  EXPECT_NE(r3.code, 0);
  EXPECT_NE(r3.out.find("parallel.expert 2: the run has 3 ranks"), std::string::npos) << r3.out;
  // groups across nodes that are not every rank (here nodes of one rank each, groups of 2 of 4 ranks)
  Result n = Mpirun(4, Args(fresh_dir("ep_bad_nodes"), "parallel.expert=2"), "MF_COMM_NODE_RANKS=1");
  EXPECT_NE(n.code, 0);
  EXPECT_NE(n.out.find("parallel.expert 2 over 4 nodes of 1 ranks: a group of expert-parallel ranks must lie "
                       "within one node"),
            std::string::npos)
      << n.out;
  Result pn = moefit(Args(fresh_dir("ep_bad_nodes_plan"), "parallel.expert=2").replace(0, 5, "plan") +
                     " --ranks 4 --node-ranks 1");
  EXPECT_NE(pn.code, 0);
  EXPECT_NE(pn.out.find("a group of expert-parallel ranks must lie within one node"), std::string::npos)
      << pn.out;
  // a plan file: one rank's decisions, for its own experts
  const std::string pf = tmpdir() + "/ep_rank0_plan.json";
  Result wp = moefit(Args(fresh_dir("ep_plan_file"), "parallel.expert=2").replace(0, 5, "plan") +
                     " --ranks 2 --json " + pf);
  ASSERT_EQ(wp.code, 0) << wp.out;
  Result fp = Mpirun(2, Args(fresh_dir("ep_bad_plan_file"), "parallel.expert=2 memory.plan=" + pf));
  EXPECT_NE(fp.code, 0);
  EXPECT_NE(fp.out.find("a plan file holds one rank's decisions"), std::string::npos) << fp.out;
  // the experts must divide
  Result d = moefit(Args(fresh_dir("ep_bad_div"), "parallel.expert=3").replace(0, 5, "plan") + " --ranks 3");
  EXPECT_NE(d.code, 0);
  EXPECT_NE(d.out.find("parallel.expert 3 does not divide the model's 8 routed experts"), std::string::npos)
      << d.out;
}

}  // namespace
