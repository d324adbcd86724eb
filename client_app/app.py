"""The Bouquet ClientApp: routes each message kind to the method's client module."""

from flwr.clientapp import ClientApp

from client_app import ditto, evaluation, fedavg, fedcg, fedska, flt, identify, ifca, local, sfl

app = ClientApp()

app.query("identify")(identify.identify)
app.train()(fedavg.train)
app.train("local")(local.train)
app.train("ditto")(ditto.train)
app.train("flt_ae")(flt.train_autoencoder)
app.query("flt_embed")(flt.embed)
app.train("ifca")(ifca.train)
app.evaluate("ifca")(ifca.evaluate)
app.train("sfl")(sfl.train)
app.train("fedska")(fedska.train)
app.query("ska_embed")(fedska.embed)
app.query("ska_grad")(fedska.slot_gradient)
app.train("fedcg")(fedcg.train)
app.evaluate("fedcg")(fedcg.evaluate)
app.query("fedcg_balance")(fedcg.balance_statistics)
app.evaluate()(evaluation.evaluate)
