"""The step every training worker takes: zero_grad, backward, the optimizer's step, and the loss averaged
over the ranks (what the tests compare with one process trained on the whole batch)."""


def step_and_mean_loss(loss, opt, dist, set_to_none: bool = True) -> float:
    opt.zero_grad(set_to_none=set_to_none)
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    return total.item()
