"""The two networks of DDPG, as layers that are forward/backward pairs you can check by hand.

Mirrors openai/baselines `her/actor_critic.py` (ActorCritic) and the `nn` helper of
`her/util.py`. Implements the networks of Andrychowicz et al. (2017), Appendix A, and Plappert
et al. (2018), Sec. 2.2: 3 hidden layers of 256 ReLU units each,

    actor   pi(o, g)     max_u * tanh(MLP on [norm(o), norm(g)])
    critic  Q(o, g, u)   MLP on [norm(o), norm(g), u / max_u]

There is no autodiff: every layer is a pure forward function returning (output, cache) next to
its backward function taking (upstream gradient, cache); test_all.py checks every backward
against finite differences.

Layout: each network keeps all its parameters in ONE flat float32 array `theta`, and its W, b
are reshaped views into it (likewise `grad`). That is baselines' getflat/setfromflat with the
copies removed: MpiAdam updates `theta` in place and the layers see the new values.

Deviation from baselines (7 in docs/deviations.md): the critic's first layer is split into the rows
for [o, g] and the rows for u, so that Q([x_pi | u]) is computed without concatenating; the
function computed is the same.

Test: `python -m pytest -q test_all.py::TestActorCritic`.
"""
import numpy as np


def linear_forward(x, W, b):
    """y = x W + b.   x: (N, d_in), W: (d_in, d_out), b: (d_out,) -> y: (N, d_out)"""
    y = x @ W
    y += b  # in place: no second (N, d_out) temporary
    return y, (x, W)


def linear_backward(dy, cache, dW=None, db=None, need_dx=True):
    """dL/dx = dy W^T; dL/dW = x^T dy; dL/db = sum_n dy. Writes dW, db in place when given
    (None skips that gradient: the actor loss needs only dL/du through the critic); skips the
    dx product when need_dx=False (nothing lies below a network's first layer)."""
    x, W = cache
    if dW is not None:
        np.matmul(x.T, dy, out=dW)
    if db is not None:
        np.sum(dy, axis=0, out=db)
    return dy @ W.T if need_dx else None


def split_linear_forward(xs, Ws, b):
    """y = [x_1 | ... | x_k] W + b = sum_i x_i W_i + b, where W_i is the block of W's rows that
    multiplies x_i. Same y as concatenating the inputs, without building that (N, sum d_i) copy.
    xs: [(N, d_i)], Ws: [(d_i, d_out)] -> y: (N, d_out)"""
    y, cache_0 = linear_forward(xs[0], Ws[0], b)
    caches = [cache_0]
    for x, W in zip(xs[1:], Ws[1:], strict=True):
        y += x @ W
        caches.append((x, W))
    return y, caches


def split_linear_backward(dy, caches, dWs=None, db=None, need_dxs=None):
    """Per block: dL/dx_i = dy W_i^T (only where need_dxs[i]), dL/dW_i = x_i^T dy; dL/db once."""
    need_dxs = need_dxs or [False] * len(caches)
    dWs = dWs or [None] * len(caches)
    return [linear_backward(dy, c, dW, db if i == 0 else None, need_dx)
            for i, (c, dW, need_dx) in enumerate(zip(caches, dWs, need_dxs, strict=True))]


def relu_forward(x):
    """y = max(x, 0), written over x (the caller hands over a fresh linear output)."""
    y = np.maximum(x, 0, out=x)
    return y, y


def relu_backward(dy, cache):
    """dL/dx = dy * [x > 0]; the cache is the output y, and y > 0 exactly where x > 0."""
    y = cache
    return dy * (y > 0)


def tanh_forward(x):
    """y = tanh(x)"""
    y = np.tanh(x)
    return y, y


def tanh_backward(dy, cache):
    """dL/dx = dy * (1 - tanh(x)^2)"""
    y = cache
    return dy * (1 - y * y)


# ---------------------------------------------------------------- the MLP

class MLP:
    """Fully connected ReLU network with a linear last layer (baselines her/util.py `nn`).

    sizes = [d_in, hidden, ..., hidden, d_out]; d_in may be a list of input block sizes, e.g.
    [d_og, d_u] for the critic, whose first layer then takes the blocks separately
    (split_linear_forward). Weights are Glorot-uniform ("xavier", as baselines'
    tf.contrib.layers.xavier_initializer), biases zero."""

    def __init__(self, sizes, rng, dtype=np.float32):
        self.in_blocks = list(np.atleast_1d(sizes[0]))  # [d_1, ..., d_k] of the input blocks
        self.sizes = [sum(self.in_blocks)] + list(sizes[1:])
        shapes = []
        for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            shapes += [(d_in, d_out), (d_out,)]
        n = sum(int(np.prod(s)) for s in shapes)
        self.theta = np.zeros(n, dtype)  # (n_params,) every parameter, the array MpiAdam updates
        self.grad = np.zeros(n, dtype)  # (n_params,) dL/dtheta, filled by backward()
        self.params = self._views(self.theta, shapes)  # [W0, b0, W1, b1, ...] views into theta
        self.grads = self._views(self.grad, shapes)  # same layout, views into grad
        for W in self.params[0::2]:
            limit = np.sqrt(6. / (W.shape[0] + W.shape[1]))
            W[...] = rng.uniform(-limit, limit, size=W.shape)
        # Row blocks of the first layer, one per input block (views: still inside theta/grad).
        cuts = np.cumsum(self.in_blocks)[:-1]
        self.W0_blocks = np.split(self.params[0], cuts)
        self.dW0_blocks = np.split(self.grads[0], cuts)

    @staticmethod
    def _views(flat, shapes):
        views, offset = [], 0
        for s in shapes:
            size = int(np.prod(s))
            views.append(flat[offset:offset + size].reshape(s))
            offset += size
        return views

    def forward(self, *xs):
        """xs: one (N, d_i) array per input block -> (N, d_out), and the cache for backward()."""
        y, c = split_linear_forward(xs, self.W0_blocks, self.params[1])
        caches = [c]
        for i in range(1, len(self.params) // 2):
            y, c = relu_forward(y)
            caches.append(c)
            y, c = linear_forward(y, self.params[2 * i], self.params[2 * i + 1])
            caches.append(c)
        return y, caches

    def backward(self, dy, caches, param_grads=True, need_dxs=None):
        """Backprop dy = dL/dy through the net. Fills self.grad (unless param_grads=False, for
        when only an input gradient is wanted) and returns [dL/dx_i] for the input blocks with
        need_dxs[i] (None for the others; by default no input gradient is computed)."""
        caches = list(caches)
        for i in reversed(range(1, len(self.params) // 2)):
            dW, db = (self.grads[2 * i], self.grads[2 * i + 1]) if param_grads else (None, None)
            dy = linear_backward(dy, caches.pop(), dW, db)
            dy = relu_backward(dy, caches.pop())
        dWs, db = (self.dW0_blocks, self.grads[1]) if param_grads else (None, None)
        return split_linear_backward(dy, caches.pop(), dWs, db, need_dxs)


class ActorCritic:
    """pi(o, g) and Q(o, g, u) on normalised inputs.

    x_pi = [o_n, g_n] (N, dim_o + dim_g) is the normalised actor input; the critic takes it and
    u / max_u as two input blocks, Q([x_pi | u / max_u]), so x_pi is never copied."""

    def __init__(self, dims, hidden, layers, max_u, rng, dtype=np.float32):
        d_og = dims["o"] + dims["g"]
        self.max_u = max_u
        self.pi = MLP([d_og] + [hidden] * layers + [dims["u"]], rng, dtype)
        self.Q = MLP([[d_og, dims["u"]]] + [hidden] * layers + [1], rng, dtype)

    def pi_forward(self, x_pi):
        """pi = max_u * tanh(MLP_pi(x_pi)): (N, dim_u)"""
        pre, c_mlp = self.pi.forward(x_pi)
        a, c_tanh = tanh_forward(pre)
        return self.max_u * a, (c_mlp, c_tanh)

    def pi_backward(self, dpi, cache, param_grads=True):
        c_mlp, c_tanh = cache
        self.pi.backward(tanh_backward(self.max_u * dpi, c_tanh), c_mlp, param_grads)

    def Q_forward(self, x_pi, u):
        """Q(x_pi, u): (N,); the critic sees the action scaled to [-1, 1]."""
        q, c = self.Q.forward(x_pi, u / self.max_u)
        return q[:, 0], c

    def Q_backward(self, dq, cache, param_grads=True, need_du=False):
        """dq: (N,). Fills Q.grad if param_grads; returns dL/du (N, dim_u) if need_du."""
        _, dx_u = self.Q.backward(dq[:, None], cache, param_grads, need_dxs=[False, need_du])
        return dx_u / self.max_u if need_du else None

    def copy_from(self, other):
        self.load_state(**other.state())

    def state(self):
        """The weights, for files (ddpg.DDPG.arrays)."""
        return {"pi": self.pi.theta, "Q": self.Q.theta}

    def load_state(self, pi, Q):
        self.pi.theta[...], self.Q.theta[...] = pi, Q
