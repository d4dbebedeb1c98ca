//! Optimizer updates as kernels: one thread per parameter element reads
//! the gradient and the step counter and writes the parameter and its state
//! in place (in the weights blob); the counter's own update is one thread.
//! The same description renders to CUDA C and runs on the CPU. The
//! arithmetic follows `torch.optim` (and the reference executor): f32
//! per element, bias corrections in f64.

use smelt_ir::{KernelGraph, NodeId, OpSet, Optimizer, Tensor};

/// An optimizer update kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// A stable, readable name, e.g. `adam_update_4096`.
    pub name: String,
    /// The rule.
    pub optimizer: Optimizer,
    /// Elements of the parameter (1 for the counter).
    pub n: usize,
}

impl Update {
    /// The description of node `id`, if it is an f32 update.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Update> {
        let node = g.node(id);
        let Some(smelt_ir::Op::Update(o)) = node.op.semantic() else { return None };
        let n = node.outputs[0].numel();
        let acc = if o.accumulate() > 1 { format!("_acc{}", o.accumulate()) } else { String::new() };
        Some(Update { name: format!("{}{acc}_{n}", o.name()), optimizer: *o, n })
    }

    /// Operands (all pointers, in the node's order): the parameter, the
    /// gradient, the counter, then the state; the counter's update has one.
    pub fn params(&self) -> Vec<String> {
        if self.optimizer == Optimizer::Count {
            return vec!["t".into()];
        }
        let mut p: Vec<String> = vec!["p".into(), "g".into(), "t".into()];
        p.extend((0..self.optimizer.states()).map(|i| format!("s{i}")));
        p
    }

    /// The operands it writes, by index: the parameter and the state (the counter).
    pub fn written(&self) -> Vec<usize> {
        if self.optimizer == Optimizer::Count {
            return vec![0];
        }
        std::iter::once(0).chain(3..3 + self.optimizer.states()).collect()
    }

    /// The CUDA C source.
    pub fn cuda(&self) -> String {
        let f = crate::c_f32;
        let mut s = String::from("#include <cuda_fp16.h>\n\n");
        s += &format!("// {}: {:?} over {} elements, in place\n", self.name, self.optimizer, self.n);
        let k = self.optimizer.accumulate().max(1);
        if self.optimizer == Optimizer::Count {
            s += &format!(
                "extern \"C\" __global__ void {}(float* t) {{\n    if (blockIdx.x == 0 && threadIdx.x == 0) t[0] += 1.0f;\n}}\n",
                self.name
            );
            return s;
        }
        if let Optimizer::Ema { momentum } = self.optimizer {
            s += &format!(
                "extern \"C\" __global__ void {}(float* p, const float* __restrict__ g, const float* __restrict__ t, unsigned long long n) {{\n",
                self.name
            );
            s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
            s += &format!("    p[i] = {} * g[i] + {} * p[i];\n}}\n", f(momentum), f(1.0 - momentum));
            return s;
        }
        let states: Vec<String> = (0..self.optimizer.states()).map(|i| format!(", float* s{i}")).collect();
        s += &format!(
            "extern \"C\" __global__ void {}(float* p, const float* __restrict__ g, const float* __restrict__ t{}, unsigned long long n) {{\n",
            self.name,
            states.concat()
        );
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
        s += "    unsigned long long micro = (unsigned long long)t[0];\n    float d = g[i];\n";
        let own = usize::from(k > 1);
        if k > 1 {
            s += &format!("    if ((micro + 1) % {k}ull != 0) {{ s0[i] += d; return; }}\n");
            s += &format!("    d = (s0[i] + d) / {};\n    s0[i] = 0.0f;\n", f(k as f32));
        }
        s += &format!("    double step = (double)(micro / {k}ull + 1);\n    float pi = p[i];\n");
        s += &self.lr_c(k);
        match self.optimizer {
            Optimizer::Sgd { momentum, dampening, nesterov, weight_decay, .. } => {
                s += &format!("    d = d + {} * pi;\n", f(weight_decay));
                if momentum != 0.0 {
                    let b = format!("s{own}[i]");
                    s +=
                        &format!("    float buf = step == 1.0 ? d : {} * {b} + {} * d;\n    {b} = buf;\n", f(momentum), f(1.0 - dampening));
                    s += &if nesterov { format!("    d = d + {} * buf;\n", f(momentum)) } else { "    d = buf;\n".to_string() };
                }
                s += "    p[i] = pi - lr * d;\n";
            }
            Optimizer::Adam { beta1, beta2, eps, weight_decay, decoupled, .. } => {
                let (m, v) = (format!("s{own}[i]"), format!("s{}[i]", own + 1));
                s += &format!("    double bc1 = 1.0 - pow({:?}, step);\n", beta1 as f64);
                s += &format!("    float bc2_sqrt = (float)sqrt(1.0 - pow({:?}, step));\n", beta2 as f64);
                s += "    float step_size = (float)((double)lr / bc1);\n";
                s += &if decoupled {
                    format!("    pi = pi * (1.0f - lr * {});\n", f(weight_decay))
                } else {
                    format!("    d = d + {} * pi;\n", f(weight_decay))
                };
                s += &format!("    float m = {m};\n    m = m + (d - m) * {};\n    {m} = m;\n", f(1.0 - beta1));
                s += &format!("    float v = {v} * {} + {} * d * d;\n    {v} = v;\n", f(beta2), f(1.0 - beta2));
                s += &format!("    float denom = sqrtf(v) / bc2_sqrt + {};\n    p[i] = pi - step_size * m / denom;\n", f(eps));
            }
            Optimizer::Ema { .. } | Optimizer::Count => unreachable!("handled above"),
        }
        s += "}\n";
        s
    }

    /// The CUDA C of the learning rate at this step: `float lr`, the base
    /// rate times the schedule's factor (computed in double, as
    /// [`Optimizer::lr_at`]).
    fn lr_c(&self, k: usize) -> String {
        let (lr, sched) = match self.optimizer {
            Optimizer::Sgd { lr, schedule, .. } | Optimizer::Adam { lr, schedule, .. } => (lr, schedule),
            Optimizer::Ema { .. } | Optimizer::Count => return String::new(),
        };
        if sched.total == 0 {
            return format!("    float lr = {};\n", crate::c_f32(lr));
        }
        let (w, t) = (sched.warmup as f64, sched.total as f64);
        format!(
            "    double t0 = (double)(micro / {k}ull);\n    double factor = t0 < {w:?} ? t0 / {:?} : fmax(0.0, 0.5 * (1.0 + cos(3.141592653589793 * (t0 - {w:?}) / {:?})));\n    float lr = (float)({:?} * factor);\n",
            w.max(1.0),
            (t - w).max(1.0),
            lr as f64
        )
    }

    /// Runs the description on the CPU: the new values of the operands it
    /// writes ([`Update::written`]), in that order.
    pub fn run_in_place(&self, inputs: &[&Tensor]) -> Vec<Tensor> {
        let t = inputs[if self.optimizer == Optimizer::Count { 0 } else { 2 }].to_f32_vec()[0];
        if self.optimizer == Optimizer::Count {
            return vec![Tensor::from_f32(inputs[0].shape().to_vec(), vec![t + 1.0])];
        }
        let shape = inputs[0].shape().to_vec();
        if let Optimizer::Ema { momentum } = self.optimizer {
            let (p, g) = (inputs[0].to_f32_vec(), inputs[1].to_f32_vec());
            return vec![Tensor::from_f32(shape, p.iter().zip(&g).map(|(&p, &g)| momentum * g + (1.0 - momentum) * p).collect())];
        }
        let k = self.optimizer.accumulate().max(1) as u64;
        let (mut p, g) = (inputs[0].to_f32_vec(), inputs[1].to_f32_vec());
        let mut st: Vec<Vec<f32>> = inputs[3..].iter().map(|x| x.to_f32_vec()).collect();
        let micro = t as u64;
        let own = usize::from(k > 1);
        let step = (micro / k + 1) as f64;
        let lr = self.optimizer.lr_at(micro / k);
        for i in 0..p.len() {
            let mut d = g[i];
            if k > 1 {
                if (micro + 1) % k != 0 {
                    st[0][i] += d;
                    continue;
                }
                d = (st[0][i] + d) / k as f32;
                st[0][i] = 0.0;
            }
            let mut pi = p[i];
            match self.optimizer {
                Optimizer::Sgd { momentum, dampening, nesterov, weight_decay, .. } => {
                    d += weight_decay * pi;
                    if momentum != 0.0 {
                        let buf = if step == 1.0 { d } else { momentum * st[own][i] + (1.0 - dampening) * d };
                        st[own][i] = buf;
                        d = if nesterov { d + momentum * buf } else { buf };
                    }
                    p[i] = pi - lr * d;
                }
                Optimizer::Adam { beta1, beta2, eps, weight_decay, decoupled, .. } => {
                    let bc1 = 1.0 - (beta1 as f64).powf(step);
                    let bc2_sqrt = (1.0 - (beta2 as f64).powf(step)).sqrt() as f32;
                    let step_size = (lr as f64 / bc1) as f32;
                    if decoupled {
                        pi *= 1.0 - lr * weight_decay;
                    } else {
                        d += weight_decay * pi;
                    }
                    let m = st[own][i] + (d - st[own][i]) * (1.0 - beta1);
                    st[own][i] = m;
                    let v = st[own + 1][i] * beta2 + (1.0 - beta2) * d * d;
                    st[own + 1][i] = v;
                    p[i] = pi - step_size * m / (v.sqrt() / bc2_sqrt + eps);
                }
                Optimizer::Ema { .. } | Optimizer::Count => unreachable!("handled above"),
            }
        }
        std::iter::once(p).chain(st).map(|v| Tensor::from_f32(shape.clone(), v)).collect()
    }
}
