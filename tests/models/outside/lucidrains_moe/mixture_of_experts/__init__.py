from mixture_of_experts.mixture_of_experts import MoE, HeirarchicalMoE, Experts
