"""Fast-dLLM v2's eval sampler (``batch_sample``): rows that share one loop, so each row's tokens
depend on the others'. Requests that join one :class:`BatchSample` (``BlockSequence.join_batch``)
are decoded as that function decodes its rows; every other block request decodes on its own
(engine/requests/block_sequence.py)."""

from __future__ import annotations

from dlm_backend.engine.requests.sequence import Pass, Sequence
from dlm_backend.errors import DLMError


class BatchSample:
    """Rows decoded together as Fast-dLLM v2's eval sampler decodes a batch.

    ``batch_sample`` (NVlabs/Fast-dLLM @ 6cf27228, ``v2/generation_functions.py``; ``v2/eval.py`` binds
    it as ``model.mdm_sample``) takes prompts right-padded with the mask id, so every row's blocks sit
    at the same absolute positions and a short row's padding is its first masks. Its rows share one
    loop, which makes each row's tokens depend on the others':

    * The batch is at one block and one sub-block at a time; a sub-block is repeated while any row
      still has masks in it (lines 90-99), and a row with none is forwarded and commits nothing.
    * With the block cache, the whole block is forwarded (and the block cache rebuilt) while *any*
      row's sub-block starts with a mask, else only the sub-block is (lines 101-109): a row whose
      first slot is committed still gets fresh keys while another row's is masked.
    * A row finishes when a denoising step unmasks the stop token (lines 125-126), but it stays in
      the batch until the block has no mask left (its later masks are still decoded, and count
      above), then it is cut after its first stop token and dropped (lines 75-78, 142-157).
    * The prompt's blocks are cached for the shortest prompt only (lines 36-46); a longer row's
      prompt blocks go through the block loop with nothing to decode, and are cached by its
      commit forward like generated blocks.
    * A block's autoregressive first token (the commit forward's last argmax, line 83) reaches
      ``input_ids``, from which the next block is read (line 66), only as lines 130-141 copy it:
      every row gets it when every row's prompt has ended or ``input_ids`` is at most one slot
      longer than the block end, else only rows whose prompt ends before the block end. So a row
      whose prompt ends exactly at a block end, shorter than the longest, starts that block with a
      mask (decoded like any other, its prediction read at itself), and a longest prompt ending one
      past a block end has its last token replaced by that argmax.
    * After the last block every row still running returns whole, with the last argmax appended
      (``x_t``, lines 161-165).

    Each row is a request (``BlockSequence.join_batch``) making one pass per engine step, the same
    kind as every other row's, so the rows must run in the same steps; a row that would run ahead
    is an error rather than a silent divergence. ``batch_sample`` draws a sample for row 0 only
    (``sample_with_top_p``), so only its greedy path is decoded this way.
    """

    def __init__(self):
        self.rows: list[Sequence] = []
        self.live: list[Sequence] = []
        self.started = False
        self.pending: set[int] = set()       # rows that have not applied this step's pass yet
        self.flagged: set[int] = set()       # rows that unmasked a stop token in this block
        self.block_cache = False             # a full-block pass of this block ran (the block cache exists)
        self.stage = ""                      # what this step's passes are: prefill, denoise or commit
        self.full = False                    # ... and whether this denoising step forwards the whole block

    def add(self, seq: Sequence) -> None:
        if self.started:
            raise DLMError("a batch_sample batch takes its rows before its first step")
        self.rows.append(seq)

    # -- the shared state ------------------------------------------------------------------

    def _start(self) -> None:
        first = self.rows[0]
        self.L, self.sub = first.block_length, first.sampler.sub_block(first.params) or first.block_length
        self.end = first.output_limit
        for seq in self.rows:
            p = seq.params
            same = (seq.block_length, seq.sampler.sub_block(p) or seq.block_length, seq.output_limit, p.cache)
            if same != (self.L, self.sub, self.end, first.params.cache) or not seq.sampler.ar_first_token:
                raise DLMError("the rows of a batch_sample batch share one Fast-dLLM v2 sampler set-up: block, "
                               "sub-block, cache and output end (prompt length + max_tokens)")
            if p.cache == "none" or p.temperature > 0 or seq.template:
                raise DLMError("batch_sample batches are decoded greedily, with a KV cache (prefix or dual) and "
                               "no response template")
        lens = [seq.prompt_len for seq in self.rows]
        self.min_len, L = min(lens), self.L
        if (self.end - 1) % L or self.end - 1 <= max(lens):
            raise DLMError("batch_sample rows end one slot past a block end after the longest prompt: it decodes "
                           "whole blocks and returns the next block's first token (line 33)")
        if self.min_len == L:
            raise DLMError("batch_sample with a shortest prompt exactly one block long decodes its second "
                           "block without any prompt (no prefill, lines 36 and 53); that run is not reproduced")
        # ``input_ids``' width (lines 43-44, 62-64, 130-140), which decides who gets a block's first token
        self.width = max(lens)
        self.block = self.min_len // L                                   # start_block_idx (line 53)
        self.stage = "prefill" if self.min_len > L else ""
        self.live = list(self.rows)
        for seq in self.live:
            seq.block_start = self.block * L
        self.started = True
        self._next()

    def _masked(self, seq: Sequence, i: int) -> bool:
        return seq.canvas[i] == seq.mask_id

    def _next(self) -> None:
        """This step's passes, from the rows' canvases: a denoising step of the first sub-block any
        row still has masks in, else the block's commit (finished rows leave before it)."""
        if self.stage != "prefill":
            start, L = self.block * self.L, self.L
            subs = [(s, min(s + self.sub, start + L)) for s in range(start, start + L, self.sub)]
            todo = [(s, e) for s, e in subs if any(self._masked(r, i) for r in self.live for i in range(s, e))]
            if todo:
                self.stage, (self.s0, self.s1) = "denoise", todo[0]
                self.full = (self.live[0].params.cache != "dual" or not self.block_cache
                             or any(self._masked(r, self.s0) for r in self.live))
            else:
                self.stage = "commit"
                for seq in [r for r in self.live if r.seq_id in self.flagged]:
                    stop = seq._first_stop(start + L)
                    seq._stop_at(stop)
                self.live = [r for r in self.live if not r.is_finished]
                self.flagged.clear()
        self.pending = {r.seq_id for r in self.live}

    # -- one row's pass ----------------------------------------------------------------------

    def plan(self, seq: Sequence) -> Pass:
        if not self.started:
            self._start()
        self._drop_ended()
        if seq.seq_id not in self.pending:
            raise DLMError("the rows of a batch_sample batch must run in the same engine steps (raise "
                           "max_num_seqs / max_num_batched_tokens so the whole batch fits one step)")
        L, start = self.L, self.block * self.L
        end = start + L
        if self.stage == "prefill":
            # the shortest prompt's whole blocks; its rows read the next token when it ends a block (lines 36-46)
            first = (self.min_len // L) * L
            ar = [first] if self.min_len % L == 0 and seq.prompt_len == self.min_len else []
            return Pass(0, first, ar, paged=True, kv_end=first, block_size=L, kind="cache")
        if self.stage == "commit":
            return Pass(start, end, [end] if self._gets_first_token(seq) else [], paged=True, kv_end=end,
                        block_size=L, kind="cache")
        cands = list(range(self.s0, self.s1))
        masked = [self._masked(seq, i) for i in cands]
        if self.full:
            return Pass(start, end, cands, paged=True, kv_end=end, block_size=L, masked=masked)
        return Pass(self.s0, self.s1, cands, paged=True, kv_end=end, block_size=L, masked=masked)

    def _gets_first_token(self, seq: Sequence) -> bool:
        """Whether the commit's argmax becomes this row's token at the block end (lines 130-141; the
        last block's goes to every row, which return ``x_t`` itself, lines 161-165)."""
        pos = (self.block + 1) * self.L
        if pos + 1 >= self.end or all(r.prompt_len < pos for r in self.live) or self.width <= pos + 1:
            return True
        return seq.prompt_len < pos                    # seq_block_idx == block_idx

    def apply(self, seq: Sequence, step: Pass, commit=None, ar_tokens: list[int] | None = None) -> None:
        if step.kind == "cache":
            seq.num_cache_passes += 1
            seq.num_cached = step.end
            if ar_tokens:
                seq.write(step.candidates, ar_tokens)
        else:
            positions = [step.candidates[i] for i in commit.indices]
            seq.write(positions, commit.token_ids)
            seq.num_forward_passes += 1
            seq.step_in_block += 1
            if any(t in seq.stop_ids for t in commit.token_ids):
                self.flagged.add(seq.seq_id)
        self._scan(seq)
        self.pending.discard(seq.seq_id)
        if not self.pending:
            self._end_step()

    def _drop_ended(self) -> None:
        """Rows ended from outside (an abort, an error) leave the batch; the step ends without them."""
        ended = {r.seq_id for r in self.live if r.is_finished}
        if ended:
            self.live = [r for r in self.live if not r.is_finished]
            self.pending -= ended
            if not self.pending and self.live:
                self._end_step()

    def _end_step(self) -> None:
        L = self.L
        if self.stage == "prefill":
            if self.min_len % L == 0 and self.width <= self.min_len:
                self.width += 1                                   # lines 43-44
        elif self.stage == "commit":
            pos = (self.block + 1) * L
            if all(r.prompt_len < pos for r in self.live) or self.width <= pos + 1:
                self.width = pos + 1
            self.block += 1
            self.block_cache = False
            if self.block * L + 1 >= self.end:
                for seq in self.live:
                    seq.finish("length", output_end=seq.output_limit)
                self.live = []
        else:
            self.block_cache = self.block_cache or self.full
        for seq in self.live:
            if self.stage != "denoise":
                seq.block_start, seq.step_in_block, seq.block_state = self.block * L, 0, None
        self.stage = "" if self.stage == "prefill" else self.stage
        if self.live:
            self._next()

    @staticmethod
    def _scan(seq: Sequence) -> None:
        """Stream committed tokens up to the first mask, holding at a stop token: whether it ends the
        row is decided when the block ends."""
        while seq.prefix_end < seq.output_limit and not seq.is_finished:
            token = seq.canvas[seq.prefix_end]
            if token == seq.mask_id or token in seq.stop_ids:
                break
            seq.prefix_end += 1
