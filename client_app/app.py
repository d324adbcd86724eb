"""The Bouquet ClientApp: routes each message kind to the method's client module.

Every train handler also accepts a fused message (`strategies.fusion`): the evaluation it carries is
routed to its own evaluate handler first, then the training runs, and one reply holds both.
"""

from collections.abc import Callable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_app import ditto, evaluation, fedavg, fedcg, fedska, flt, identify, ifca, local, sfl
from strategies.fusion import fuse_reply, is_fused, split_request

Handler = Callable[[Message, Context], Message]

app = ClientApp()


def with_evaluation(train: Handler) -> Handler:
    """`train`, preceded by the evaluation a fused message carries (run through `app`'s routing)."""
    def handler(message: Message, context: Context) -> Message:
        if not is_fused(message):
            return train(message, context)
        train_part, evaluation_part = split_request(message)
        evaluated = app(evaluation_part, context)
        if evaluated.has_error():
            raise RuntimeError(f"evaluation failed: {evaluated.error.reason}")
        return fuse_reply(message, train(train_part, context), evaluated)

    handler.__name__ = handler.__qualname__ = getattr(train, "__name__", "train")
    handler.__doc__ = train.__doc__
    return handler


app.query("identify")(identify.identify)
app.train()(with_evaluation(fedavg.train))
app.train("local")(with_evaluation(local.train))
app.train("ditto")(with_evaluation(ditto.train))
app.train("flt_ae")(flt.train_autoencoder)
app.query("flt_embed")(flt.embed)
app.train("ifca")(with_evaluation(ifca.train))
app.evaluate("ifca")(ifca.evaluate)
app.train("sfl")(with_evaluation(sfl.train))
app.train("fedska")(with_evaluation(fedska.train))
app.query("ska_embed")(fedska.embed)
app.query("ska_grad")(fedska.slot_gradient)
app.train("fedcg")(with_evaluation(fedcg.train))
app.evaluate("fedcg")(fedcg.evaluate)
app.query("fedcg_balance")(fedcg.balance_statistics)
app.evaluate()(evaluation.evaluate)
