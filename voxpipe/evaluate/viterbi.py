"""An exact Viterbi decoder for sparse transition matrices: librosa's answer, bit for bit, in a fraction of
the time, without holding the GIL.

librosa's `sequence.viterbi` adds every state's score to every transition, S² additions a frame, and
allocates an S×S array for it. probabilistic YIN's transition matrix (pitch.py: 798 states) is mostly
zeros: a pitch moves at most 45 bins a frame (±4.5 semitones in 20 ms), so a column has at most 182 real
entries. librosa does not skip the zeros: it takes logs of `transition + tiny`, so a zero becomes one
constant, log(tiny) (-708), and that branch can still win where the in-band scores are even lower (an
observation probability of zero also costs log(tiny)). So the zeros are kept, as what they are: every
out-of-band candidate of a frame is `value[k] + log(tiny)`, the same constant for all, so the best of them
is the frame's best state, `top`, whenever `top` lies outside the column's band. When it lies inside,
`top + log(tiny)` cannot win either: its in-band score is higher, as a real transition's log is hundreds
above log(tiny) (checked when the matrix is read), and the scores, sums of at most 1416 a frame, never grow
large enough for a float addition to round that gap away. So each column costs its band plus one
comparison with `top`, not S additions.

Each score is the same float addition librosa makes, compared in the same order of precedence (the
larger wins, the lower index on a tie), so the path, and every figure read from it, is librosa's
(tests/test_pitch.py holds it to `librosa.sequence.viterbi` and `librosa.pyin`). The kernel is numba
with `nogil`: evaluate scores pitch on a thread beside generation (scoring_threads.py), and librosa's own
Viterbi held the GIL for its whole pass.
"""

from __future__ import annotations

import numba
import numpy as np

MARGIN = 100.0  # log units a real transition must lie above log(tiny) (pyin's smallest: ~690)


class SparseTransitions:
    """A log transition matrix as its constant (the log of a zero transition) and, per column, the rows
    that differ from it (compressed sparse columns)."""

    def __init__(self, transition: np.ndarray) -> None:
        epsilon = np.finfo(transition.dtype).tiny  # librosa's `tiny(prob)`: prob and transition are float64
        log_trans = np.log(transition + epsilon)  # librosa's: the same floats
        self.floor = float(np.log(epsilon))  # what log_trans holds wherever transition is 0
        rows, cols = np.nonzero(log_trans.T != self.floor)  # column by column, rows ascending within each
        self.rows = cols.astype(np.int64)
        self.values = log_trans.T[rows, cols]
        if self.values.size and self.values.min() < self.floor + MARGIN:
            raise ValueError(f"a transition probability below e^{MARGIN} * tiny: the sparse decoder's "
                             "shortcut needs real transitions well above zero")
        self.starts = np.searchsorted(rows, np.arange(transition.shape[0] + 1)).astype(np.int64)


def viterbi(prob: np.ndarray, transitions: SparseTransitions, p_init: np.ndarray) -> np.ndarray:
    """The most likely state sequence, as `librosa.sequence.viterbi(prob, transition, p_init=p_init)`
    returns it for a 2-D float64 `prob` [states, frames]."""
    epsilon = np.finfo(np.float64).tiny
    log_prob = np.ascontiguousarray(np.log(np.asarray(prob, dtype=np.float64) + epsilon).T)
    return _decode(log_prob, transitions.rows, transitions.values, transitions.starts, transitions.floor,
                   np.log(p_init + epsilon))


@numba.njit(nogil=True, cache=True)  # the per-user cache of voxpipe/cli.py native_crash_safety
def _decode(log_prob, rows, values, starts, floor, log_p_init):  # pragma: no cover (numba)
    n_steps, n_states = log_prob.shape
    value = np.empty((n_steps, n_states))
    ptr = np.empty((n_steps, n_states), dtype=np.int64)
    value[0] = log_prob[0] + log_p_init
    out_of_band = np.empty(n_states)
    for t in range(1, n_steps):
        previous = value[t - 1]
        top = 0
        for k in range(n_states):
            out_of_band[k] = previous[k] + floor
            if out_of_band[k] > out_of_band[top]:
                top = k
        for j in range(n_states):
            best, arg = -np.inf, n_states
            for e in range(starts[j], starts[j + 1]):
                k = rows[e]
                score = previous[k] + values[e]
                if score > best or (score == best and k < arg):
                    best, arg = score, k
            score = out_of_band[top]  # the best out-of-band score, when top is out of band (docstring)
            if score > best or (score == best and top < arg):
                best, arg = score, top
            ptr[t, j] = arg
            value[t, j] = log_prob[t, j] + best
    state = np.empty(n_steps, dtype=np.int64)
    state[-1] = np.argmax(value[-1])
    for t in range(n_steps - 2, -1, -1):
        state[t] = ptr[t + 1, state[t + 1]]
    return state
