// Generator.cpp - the generation loop (Generator.h).

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Generator.h"

#include "parax/runtime/Grid.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>

namespace parax::runtime {

void Generator::finish(Result &result, const std::vector<int64_t> &ranOf,
                            const std::vector<std::vector<std::vector<float>>> &stepLogits, int64_t vocab) {
  const int64_t width = this->width();
  int64_t ran = *std::max_element(ranOf.begin(), ranOf.end()); // fewer than total when every row stopped
  result.ran = ran;
  for (int64_t m = 0; m < micro; ++m) // the positions of its rows a stopped microbatch never ran
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t after = ranOf[m] + 1; after < endOf(firstRowOf(m) + b); ++after)
        sequence[(firstRowOf(m) + b) * width + after] = static_cast<int32_t>(stopToken);
  if (replicaWriter) {
    // This replica's rows of the sequence: [micro * batch, width].
    int64_t mine = micro * batch;
    Tensor tokens = Tensor::ints({mine, width});
    std::copy(sequence.begin() + firstRowOf(0) * width, sequence.begin() + (firstRowOf(0) + mine) * width,
              tokens.i.begin());
    result.results.push_back(std::move(tokens));
    if (wantLogits) { // [rows, positions run, vocab]; NaN where a stopped microbatch ran none
      Tensor ordered = Tensor::floats({mine, ran, vocab}); // and past each row's last token
      std::fill(ordered.f.begin(), ordered.f.end(), std::numeric_limits<float>::quiet_NaN());
      for (int64_t m = 0; m < micro; ++m)
        for (int64_t b = 0; b < batch; ++b) {
          int64_t positions = std::min<int64_t>(stepLogits[m].size(), endOf(firstRowOf(m) + b) - 1);
          for (int64_t p = 0; p < positions; ++p)
            std::copy(&stepLogits[m][p][b * vocab], &stepLogits[m][p][(b + 1) * vocab],
                      &ordered.f[((m * batch + b) * ran + p) * vocab]);
        }
      result.results.push_back(std::move(ordered));
    }
  }
}

Status Generator::run(Result &result) {
  result = Result();
  auto inputsAt = [&](const GenerationProgram &program, int64_t t, int64_t m) {
    return generationInputs(program, sequence, promptLength + generate, firstRowOf(m), t);
  };
  // Position t holds token t. The prompt's whole chunks go through the
  // prefill program (with --prefill), every other token through the step.
  // After the prompt's last token, each replica's writer picks every
  // row's next token and sends it to the other ranks of its replica
  // (point to point: replicas never wait for each other, and a stage
  // waits for microbatch m's tokens only before its next step of m).
  // Each position runs microbatch 0, 1, ... in turn on every stage, so
  // that stage s works on microbatch m while stage s + 1 works on m - 1.
  const int64_t width = this->width(), total = width - 1;
  // With a second --output, per microbatch and position run: [batch, vocab].
  std::vector<std::vector<std::vector<float>>> stepLogits(micro);
  std::vector<int64_t> ranOf(micro, 0);   // positions each microbatch has run
  std::vector<int64_t> awaited(micro, -1); // a position whose tokens this rank awaits from the writer
  std::vector<bool> stopped(rows, false);  // rows that gave --stop-token
  auto shortestPromptOf = [&](int64_t m) {
    int64_t shortest = promptLength;
    for (int64_t b = 0; b < batch; ++b) shortest = std::min(shortest, promptLengths[firstRowOf(m) + b]);
    return shortest;
  };
  // Whether microbatch m has nothing left to do at position t: each row
  // has given the stop token or has all its tokens.
  auto microDone = [&](int64_t m, int64_t t) {
    for (int64_t b = 0; b < batch; ++b) {
      int64_t row = firstRowOf(m) + b;
      if (!stopped[row] && t + 1 < endOf(row)) return false;
    }
    return true;
  };
  const int replicaWriterRank = writerOf(exe, replica);
  std::vector<int> peers; // the replica's other ranks, which the writer sends its tokens
  for (int r = 0; r < size; ++r)
    if (r != replicaWriterRank && rankWithReplica(exe, r, replica) == r) peers.push_back(r);
  constexpr int kTokensTag = 7; // (tags 0 and 1 carry activations and results)
  std::deque<std::vector<int32_t>> sent; // the tokens of sends in flight
  std::vector<MPI_Request> sends;
  // Microbatch m's tokens for position `next`: into the sequence of the
  // rows past their prompts and short of their ends, where --stop-token
  // makes a stopped row give it again (every rank of the replica applies
  // the same tokens, so all agree on what runs).
  auto record = [&](int64_t m, int64_t next, const std::vector<int32_t> &picked) {
    for (int64_t b = 0; b < batch; ++b) {
      int64_t row = firstRowOf(m) + b;
      if (next < promptLengths[row] || next >= endOf(row)) continue; // a prompt's token, or past the row's end
      int32_t &token = sequence[row * width + next];
      token = picked[b];
      if (stopToken < 0) continue;
      if (stopped[row]) token = static_cast<int32_t>(stopToken);
      stopped[row] = stopped[row] || token == stopToken;
    }
  };
  auto settle = [&](int64_t m) { // the tokens this rank awaits for microbatch m
    if (awaited[m] < 0) return;
    std::vector<int32_t> picked(batch);
    {
      auto watched = watch("receiving the generated tokens");
      MPI_Recv(picked.data(), static_cast<int>(batch), MPI_INT32_T, replicaWriterRank, kTokensTag,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    record(m, awaited[m], picked);
    awaited[m] = -1;
  };
  int64_t vocab = 0;
  const std::string notLogits =
      "the generation step's first result must be logits [batch, tokens, vocab] or [batch, 1, vocab]";
  auto advance = [&](const GenerationProgram &program, int64_t t, int64_t m, Runner &running) -> Status {
    int64_t tokens = program.tokens;
    Status s = running.setInputs(inputsAt(program, t, m));
    if (s.isOk()) s = running.run();
    if (!s.isOk()) return s;
    ranOf[m] = t + tokens;
    int64_t next = t + tokens;         // the position the chosen tokens take
    bool picks = next >= shortestPromptOf(m); // (before, every row's next token is its prompt's)
    if (!replicaWriter) {
      if (picks) awaited[m] = next;
      return Status::ok();
    }
    // The logits of every position run, or (a program built
    // --last-logits) of the last one alone: how many a row has (0: neither).
    auto positionsOf = [&](int64_t n) -> int64_t { return n == batch * tokens || n == batch ? n / batch : 0; };
    std::vector<int32_t> chosen(batch);
    bool greedily = sampling.temperature <= 0;
    if (picks && greedily) { // where the logits are (the GPU: one index a row comes back)
      auto picked = running.greedyTokens();
      if (!picked.isOk()) return picked.status();
      int64_t returned = positionsOf(static_cast<int64_t>(picked.value().size()));
      if (returned == 0) return Status::error(notLogits);
      for (int64_t b = 0; b < batch; ++b) chosen[b] = picked.value()[b * returned + returned - 1];
    }
    if (wantLogits || (picks && !greedily)) {
      Tensor logits = running.outputs()[0];
      if (logits.isInt || logits.shape.size() != 3 || logits.shape[0] != batch) return Status::error(notLogits);
      int64_t returned = positionsOf(batch * logits.shape[1]);
      if (returned == 0) return Status::error(notLogits);
      vocab = logits.shape.back();
      if (picks && !greedily) // drawn on the host, the same on any backend
        for (int64_t b = 0; b < batch; ++b)
          chosen[b] = sampleToken(&logits.f[(b * returned + returned - 1) * vocab], vocab, sampling,
                                  firstRowOf(m) + b, next);
      if (wantLogits) { // every position's logits too (NaN: not computed)
        for (int64_t j = 0; j < tokens; ++j) {
          std::vector<float> block(batch * vocab, std::numeric_limits<float>::quiet_NaN());
          int64_t row = j - (tokens - returned); // this position's row of the logits, if any
          for (int64_t b = 0; b < batch && row >= 0; ++b)
            std::copy(&logits.f[(b * returned + row) * vocab], &logits.f[(b * returned + row + 1) * vocab],
                      &block[b * vocab]);
          stepLogits[m].push_back(std::move(block));
        }
      }
    }
    if (!picks) return Status::ok();
    record(m, next, chosen);
    for (int peer : peers) {
      sent.push_back(chosen);
      sends.emplace_back();
      MPI_Isend(sent.back().data(), static_cast<int>(batch), MPI_INT32_T, peer, kTokensTag, MPI_COMM_WORLD,
                &sends.back());
    }
    return Status::ok();
  };
  Status failed = Status::ok();
  int64_t t = 0;
  if (chunks > 0) {
    if (barrier) barrier("the barrier before the prefill");
    auto start = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < chunks && failed.isOk(); ++c, t += prefill.tokens)
      for (int64_t m = 0; m < micro && failed.isOk(); ++m) failed = advance(prefill, t, m, prefills[m]);
    if (!failed.isOk()) return failed;
    if (barrier) barrier("the barrier after the prefill");
    result.prefillSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // A step's time: between the ends of two positions on this rank (no
  // barrier: it would drain the pipeline of microbatches).
  auto last = std::chrono::steady_clock::now(), reported = last;
  int64_t reportedAt = t;
  for (; t < total; ++t) {
    bool any = false;
    for (int64_t m = 0; m < micro; ++m) {
      settle(m);
      if (microDone(m, t)) continue; // every row of it has its tokens or has given the stop token
      any = true;
      failed = advance(step, t, m, steps[m]);
      if (!failed.isOk()) return failed;
    }
    if (!any) break;
    auto now = std::chrono::steady_clock::now();
    result.times.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    // Progress, about once a second (one line from the first replica's
    // writer; nothing for a loop shorter than that).
    double since = std::chrono::duration<double>(now - reported).count();
    if (progress && replicaWriter && replica == 0 && since >= 1.0 && t + 1 < total) {
      progress(t + 1, total, static_cast<double>(t + 1 - reportedAt) / since * static_cast<double>(micro * batch));
      reported = now;
      reportedAt = t + 1;
    }
  }
  for (int64_t m = 0; m < micro; ++m) settle(m);
  if (!sends.empty()) {
    auto watched = watch("sending the generated tokens");
    MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
  }
  finish(result, ranOf, stepLogits, vocab);
  return Status::ok();
}

} // namespace parax::runtime
